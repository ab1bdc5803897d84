"""Login throttling (django-axes): ten failures for one username from one address lock that pair out."""

from __future__ import annotations

from typing import Any

import pytest
from django.conf import settings
from django.test import Client

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.filterwarnings("ignore:No directory at:UserWarning"),  # whitenoise: collectstatic has not run here
]

LOGIN_PAGES = ["/accounts/login/", "/admin/login/"]


@pytest.fixture
def staff(django_user_model: Any) -> Any:
    return django_user_model.objects.create_user("clerk", password="right-horse-battery", is_staff=True)


def _login(client: Client, page: str, username: str, password: str) -> Any:
    return client.post(page, {"username": username, "password": password, "next": "/admin/"})


def test_defaults_are_ten_failures_and_fifteen_minutes():
    """The lockout counts per (username, address), at 10 failures, for 15 minutes."""
    assert settings.AXES_FAILURE_LIMIT == 10
    assert settings.AXES_COOLOFF_TIME.total_seconds() == 15 * 60
    assert settings.AXES_LOCKOUT_PARAMETERS == [["username", "ip_address"]]


@pytest.mark.parametrize("page", LOGIN_PAGES)
def test_eleventh_login_is_refused_even_with_the_right_password(staff: Any, page: str):
    """After ten bad passwords, the right one gets 429 and no session, on both login pages."""
    client = Client()
    for _ in range(settings.AXES_FAILURE_LIMIT):
        _login(client, page, "clerk", "wrong")
    response = _login(client, page, "clerk", "right-horse-battery")
    assert response.status_code == 429
    assert "_auth_user_id" not in client.session


@pytest.mark.parametrize("page", LOGIN_PAGES)
def test_nine_failures_then_the_right_password_logs_in(staff: Any, page: str):
    """Below the limit the right password still works (and resets the count)."""
    client = Client()
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        assert _login(client, page, "clerk", "wrong").status_code == 200
    assert _login(client, page, "clerk", "right-horse-battery").status_code == 302
    assert "_auth_user_id" in client.session


def test_lockout_is_per_username_and_address(staff: Any, django_user_model: Any):
    """A locked-out username does not lock out another user at the same address, nor itself at another."""
    django_user_model.objects.create_user("other", password="other-horse-battery", is_staff=True)
    for _ in range(settings.AXES_FAILURE_LIMIT):
        _login(Client(), "/accounts/login/", "clerk", "wrong")
    assert _login(Client(), "/accounts/login/", "other", "other-horse-battery").status_code == 302
    elsewhere = Client(REMOTE_ADDR="10.9.8.7")
    assert _login(elsewhere, "/accounts/login/", "clerk", "right-horse-battery").status_code == 302
