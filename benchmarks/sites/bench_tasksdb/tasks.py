from django.tasks import task

from benchsite.tick import tick


@task
def noop(i=0):
    tick(i)
