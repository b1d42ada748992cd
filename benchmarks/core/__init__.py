"""The harness: virtualenvs, fresh databases, processes and what is read off them.

Everything here runs in the interpreter that started ``benchmarks.run`` and uses the standard
library only; the systems under test run in their own virtualenvs (see ``envs.py``).
"""
