"""Running one claimed job and recording its outcome: the same path for ``durq_worker`` and ``testing.drain()``."""
