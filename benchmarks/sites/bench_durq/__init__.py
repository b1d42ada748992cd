"""Benchmark job and enqueue operations for one system."""
