from procrastinate.contrib.django import app

from benchsite.tick import tick


@app.task(name="bench.noop")
def noop(i=0):
    tick(i)
