"""The Django project every system's benchmark processes run in (workers, producers, the web app)."""
