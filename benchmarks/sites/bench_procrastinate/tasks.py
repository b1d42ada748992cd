from benchsite.tick import tick
from procrastinate.contrib.django import app


@app.task(name="bench.noop")
def noop(i=0):
    tick(i)
