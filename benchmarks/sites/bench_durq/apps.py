import os

from django.apps import AppConfig


class BenchDurqConfig(AppConfig):
    name = "bench_durq"

    def ready(self):
        path = os.environ.get("BENCH_CLAIMS")
        if path:
            from . import claim_log

            claim_log.install(path)
        path = os.environ.get("BENCH_ANATOMY")
        if path:
            from . import anatomy

            anatomy.install(path)
