from benchsite.tick import tick
from huey.contrib.djhuey import task


@task()
def noop(i=0):
    tick(i)
