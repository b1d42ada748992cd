from huey.contrib.djhuey import task

from benchsite.tick import tick


@task()
def noop(i=0):
    tick(i)
