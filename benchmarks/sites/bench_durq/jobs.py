from benchsite.tick import tick

from django_durq import job

try:
    from django_durq import Limit
except ImportError:  # a revision from before per-key limits, built by the compare mode
    Limit = None


@job(name="bench.noop")
def noop(ctx, i=0):
    tick(i)


# Keys are plentiful: the limit never holds a job back, so a drain measures what enforcing it costs.
KEYS = 1_000


if Limit is not None:

    @job(name="bench.keyed", limit=Limit(max_running=1, key=lambda i=0: i % KEYS))
    def keyed(ctx, i=0):
        tick(i)

else:
    keyed = None


# The fan-in callback of the workflows workload: its tick (number -1) marks when it started.
CALLBACK_TICK = -1


@job(name="bench.callback")
def callback(ctx):
    tick(CALLBACK_TICK)
