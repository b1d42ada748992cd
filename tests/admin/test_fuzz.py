"""Malformed requests to every admin page and django-durq's own URLs: a 4xx or a page, never a 500."""

from __future__ import annotations

from urllib.parse import quote

import pytest
from django.contrib import admin
from django.contrib.auth.models import User
from django.test import Client, override_settings
from django.urls import include, path

from tests.admin.helpers import dead_letter
from tests.ops.test_ops import make_job

pytestmark = [pytest.mark.django_db, pytest.mark.urls("tests.admin.test_fuzz")]

urlpatterns = [path("admin/", admin.site.urls), path("durq/", include("django_durq.urls"))]

BASE = "/admin/django_durq/"
CHANGELISTS = [f"{BASE}job/", f"{BASE}deadletter/", f"{BASE}schedule/", f"{BASE}queue/"]
ANSWERS = {200, 302, 400, 404}

MALFORMED = [
    "١٢٣",  # Arabic-Indic digits: isdigit() is true, int() takes them, the database does not
    "²",  # a superscript digit: isdigit() is true, int() refuses it
    "#١٢",
    "\x00",
    "a\x00b",
    "1\x00",
    "99999999999999999999999999",
    "9223372036854775808",
    "-1",
    "-9223372036854775809",
    "0",
    "1.5",
    "1e5",
    "",
    " ",
    "%",
    "日本語",
    "🙂",
    "' OR 1=1 --",
    "1; DROP TABLE durq_job",
    "x" * 5000,
]

FILTERS = ["q", "queue", "name", "status", "o", "p", "e", "_changelist_filters"]


@pytest.fixture
def superuser() -> Client:
    client = Client(raise_request_exception=False)
    client.force_login(User.objects.create_superuser("root"))
    return client


class Answers:
    """Every malformed request's answer, so that one run lists all that went wrong."""

    def __init__(self) -> None:
        self.wrong: list[str] = []

    def __call__(self, response, what: str) -> None:
        if response.status_code not in ANSWERS:
            self.wrong.append(f"{what} answered {response.status_code}")

    def assert_all_sensible(self) -> None:
        assert not self.wrong, "\n".join(self.wrong[:40]) + f"\n({len(self.wrong)} in all)"


@pytest.fixture
def check() -> Answers:
    return Answers()


def test_changelists_answer_malformed_filters_and_searches(superuser, check):
    dead_letter()
    make_job("waiting")
    for url in CHANGELISTS:
        for value in MALFORMED:
            for key in FILTERS:
                check(superuser.get(url, {key: value}), f"GET {url}?{key}={value!r}")
    check.assert_all_sensible()


def test_object_urls_answer_malformed_ids(superuser, check):
    job = dead_letter()
    for value in [*MALFORMED, f"{job.pk}x", f"{job.pk} "]:
        ident = quote(value, safe="") or "%20"
        for model in ("job", "deadletter", "schedule"):
            check(superuser.get(f"{BASE}{model}/{ident}/change/"), f"GET {model}/{value!r}/change/")
            check(superuser.get(f"{BASE}{model}/{ident}/history/"), f"GET {model}/{value!r}/history/")
        for model, actions in (("job", ["retry", "cancel"]), ("deadletter", ["retry", "purge"])):
            for name in actions:
                url = f"{BASE}{model}/{ident}/{name}/"
                check(superuser.post(url), f"POST {url}")
                if name == "purge":
                    check(superuser.get(url), f"GET {url}")
    check.assert_all_sensible()
    assert job.__class__.objects.get(pk=job.pk).status == "dead", "no malformed request touched the job"


def test_actions_answer_malformed_selections(superuser, check):
    dead_letter()
    actions = {
        f"{BASE}job/": ["retry_selected", "cancel_selected"],
        f"{BASE}deadletter/": ["retry_selected", "purge_selected"],
        f"{BASE}schedule/": ["run_now"],
    }
    for url, names in actions.items():
        for name in names:
            for value in MALFORMED:
                for extra in ({}, {"post": "yes"}, {"select_across": value}):
                    data = {"action": name, "_selected_action": [value], "index": value or "0", **extra}
                    check(superuser.post(url, data), f"POST {url} {name} with {value!r} {extra}")
    check.assert_all_sensible()


def test_monitoring_views_answer_malformed_requests(settings, check):
    token = "s3cret-s3cret-s3cret"
    with override_settings(DURQ={**settings.DURQ, "MONITORING": {"TOKEN": token}}):
        client = Client(raise_request_exception=False)
        for url in ("/durq/health/", "/durq/metrics/"):
            for value in MALFORMED:
                for header in (f"Bearer {value}", value, f"Bearer {token}{value}"):
                    response = client.get(url, {"q": value}, HTTP_AUTHORIZATION=header)
                    if response.status_code not in (403, 503):
                        check(response, f"GET {url} with Authorization {header!r}")
                assert client.post(url, {"q": value}, HTTP_AUTHORIZATION=f"Bearer {token}").status_code == 405
    check.assert_all_sensible()


def test_pause_and_resume_answer_malformed_queues_and_reasons(superuser, check):
    for url in (f"{BASE}queue/pause/", f"{BASE}queue/resume/"):
        for value in MALFORMED:
            check(superuser.get(url, {"queue": value}), f"GET {url}?queue={value!r}")
            check(superuser.post(url, {"queue": value, "reason": "maintenance"}), f"POST {url} queue={value!r}")
            check(superuser.post(url, {"queue": "fast", "reason": value}), f"POST {url} reason={value!r}")
    check.assert_all_sensible()
