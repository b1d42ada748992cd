"""Signals django-durq sends."""

from django.dispatch import Signal

# Sent when a job becomes a dead letter, with job_id, name, queue and errors (every attempt's).
job_dead = Signal()

# Sent when a job finished and its completion is recorded, with job_id, name, queue and result
# (the handler's return value).
job_finished = Signal()
