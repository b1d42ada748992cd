"""Signals django-durq sends."""

from django.dispatch import Signal

# Sent when a job becomes a dead letter, with job_id, name, queue and errors (every attempt's).
job_dead = Signal()
