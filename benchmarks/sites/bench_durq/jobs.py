from benchsite.tick import tick

from django_durq import job


@job(name="bench.noop")
def noop(ctx, i=0):
    tick(i)
