"""Monitoring endpoints: ``path("durq/", include("django_durq.urls"))``. Closed by default (see ``views.py``)."""

from django.urls import path

from . import views

app_name = "django_durq"

urlpatterns = [
    path("health/", views.health, name="health"),
    path("metrics/", views.metrics, name="metrics"),
]
