"""A compressed day in production: rolling deploys, killed workers and a database restart under a steady load.

``python -m benchmarks.day --db postgres --minutes 30`` (see benchmarks/README.md). Not part of
``make test``: it runs for half an hour or more, with servers of its own.
"""
