"""What the admin tests share: clients of staff users, a dead letter with its history, the text of a
response, and the headless Chromium pages are driven through (``Site``)."""

from __future__ import annotations

import json
from typing import Any

from django.contrib.auth.models import Permission, User
from django.test import Client

from django_durq.clock import now_ms
from django_durq.conf import get_settings
from django_durq.db.store import Store
from django_durq.models import Job
from tests.ops.test_ops import make_job

SCRIPT = "<script>alert(1)</script>"
JOBS = "/admin/django_durq/job/"
QUEUES = "/admin/django_durq/queue/"
PASSWORD = "correct horse battery staple"
WAIT_S = 15  # liveness cap for a page to show what it should


def staff(username: str, *codenames: str) -> Client:
    user = User.objects.create_user(username, is_staff=True)
    user.user_permissions.set(Permission.objects.filter(content_type__app_label="django_durq", codename__in=codenames))
    client = Client()
    client.force_login(user)
    return client


def dead_letter(**fields: object) -> Job:
    errors = [
        {
            "attempt": n,
            "at_ms": 1_700_000_000_000 + n,
            "worker": "web-1:42:abc",
            "kind": "exception",
            "type": "ValueError",
            "message": f"attempt {n} broke",
            "traceback": f"Traceback (most recent call last):\n  line {n}\nValueError: attempt {n} broke",
        }
        for n in (1, 2, 3)
    ]
    return make_job("dead", **{"errors": json.dumps(errors), "finished_ms": now_ms(), **fields})


def claim(queue: str, count: int, worker_id: str) -> list[int]:
    """Claim due jobs of ``queue`` as the worker would, running none of them."""
    settings = get_settings()
    return [job.id for job in Store(settings.database).claim(queue, count, now_ms(), worker_id, settings.queue(queue).limits)]


def text(response: Any) -> str:
    return " ".join(response.content.decode().split())


def messages_of(response: Any) -> list[str]:
    return [str(message) for message in response.context["messages"]]


# --- in headless Chromium --------------------------------------------------------------------------


class Site:
    def __init__(self, driver: Any, url: str) -> None:
        self.driver = driver
        self.url = url

    def login(self, username: str) -> None:
        from selenium.webdriver.common.by import By

        self.driver.delete_all_cookies()
        self.open("/admin/login/?next=/admin/")
        self.driver.find_element(By.ID, "id_username").send_keys(username)
        self.driver.find_element(By.ID, "id_password").send_keys(PASSWORD)
        self.driver.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
        self.wait_for("#user-tools")
        assert "Log out" in self.driver.page_source

    def open(self, path: str) -> None:
        self.driver.get(self.url + path)

    def wait_for(self, selector: str) -> Any:
        from selenium.webdriver.common.by import By
        from selenium.webdriver.support import expected_conditions
        from selenium.webdriver.support.ui import WebDriverWait

        return WebDriverWait(self.driver, WAIT_S).until(
            expected_conditions.presence_of_element_located((By.CSS_SELECTOR, selector))
        )

    def find(self, selector: str) -> list[Any]:
        from selenium.webdriver.common.by import By

        return self.driver.find_elements(By.CSS_SELECTOR, selector)

    def click_link(self, text: str) -> None:
        from selenium.webdriver.common.by import By

        self.driver.find_element(By.LINK_TEXT, text).click()

    def run_action(self, name: str, ids: list[int]) -> None:
        from selenium.webdriver.support.ui import Select

        for job_id in ids:
            self.find(f'input[name="_selected_action"][value="{job_id}"]')[0].click()
        Select(self.find('select[name="action"]')[0]).select_by_value(name)
        self.find('button[name="index"]')[0].click()

    def messages(self) -> list[str]:
        return [element.text for element in self.find("ul.messagelist li")]

    def listed_ids(self) -> list[int]:
        return [int(element.get_attribute("value")) for element in self.find('input[name="_selected_action"]')]

    def no_alert(self) -> bool:
        from selenium.common.exceptions import NoAlertPresentException

        try:
            self.driver.switch_to.alert  # noqa: B018 - raises when no alert is open
        except NoAlertPresentException:
            return True
        return False


def user(username: str, *codenames: str, superuser: bool = False) -> User:
    if superuser:
        return User.objects.create_superuser(username, password=PASSWORD)
    account = User.objects.create_user(username, password=PASSWORD, is_staff=True)
    account.user_permissions.set(Permission.objects.filter(content_type__app_label="django_durq", codename__in=codenames))
    return account
