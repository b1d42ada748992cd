"""The fault catalogue of RELIABILITY.md, with real worker processes and real databases."""
