"""Repeated authentication failures from one address get 429s; the count is shared by every process."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import httpx
import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.test import APIClient

from quicksave.models import AuthFailureWindow

BAD_KEY = "qs_abcdef123456_not-the-secret"
LIMIT = 3


@pytest.fixture
def limit(settings: Any) -> int:
    settings.QUICKSAVE_AUTH_FAILURES_PER_MINUTE = LIMIT
    return LIMIT


def threads_with(key: str, address: str = "10.0.0.1") -> Any:
    client = APIClient(REMOTE_ADDR=address)
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    return client.get("/api/v1/threads/")


def assert_throttled(response: Any) -> None:
    assert response.status_code == 429, response.content
    error = response.json()["error"]
    assert error["code"] == "throttled"
    assert "Too many failed authentications" in error["message"]
    assert 1 <= error["detail"]["retry_after"] <= 60
    assert response["Retry-After"] == str(error["detail"]["retry_after"])


def test_bad_agent_keys_past_the_limit_get_429_in_the_error_format(db: Any, limit: int) -> None:
    for _ in range(limit):
        assert threads_with(BAD_KEY).status_code == 401
    assert_throttled(threads_with(BAD_KEY))
    assert_throttled(threads_with(BAD_KEY))


def test_another_address_is_not_throttled(db: Any, limit: int) -> None:
    for _ in range(limit + 1):
        threads_with(BAD_KEY, "10.0.0.1")
    assert threads_with(BAD_KEY, "10.0.0.2").status_code == 401


def test_a_valid_key_is_accepted_without_a_throttle_query(db: Any, limit: int, agent_key: str) -> None:
    for _ in range(limit + 1):
        threads_with(BAD_KEY)

    with CaptureQueriesContext(connection) as queries:
        response = threads_with(agent_key)

    assert response.status_code == 200
    assert not [query["sql"] for query in queries if AuthFailureWindow._meta.db_table in query["sql"]]


def test_the_count_starts_again_a_minute_after_the_first_failure(db: Any, limit: int) -> None:
    for _ in range(limit + 1):
        threads_with(BAD_KEY)
    AuthFailureWindow.objects.update(window_start=timezone.now() - timedelta(seconds=61))

    assert threads_with(BAD_KEY).status_code == 401
    assert AuthFailureWindow.objects.get(address="10.0.0.1").failures == 1


def sign_in(password: str) -> Any:
    return Client(REMOTE_ADDR="10.0.0.5").post("/login/", {"username": "rita", "password": password})


def test_failed_sign_ins_past_the_limit_get_429_even_with_the_right_password(db: Any, limit: int) -> None:
    User.objects.create_user("rita", password="the-right-password-1")
    for _ in range(limit):
        response = sign_in("wrong")
        assert response.status_code == 200
        assert "do not match" in response.content.decode()

    for password in ("wrong", "the-right-password-1"):
        response = sign_in(password)
        assert response.status_code == 429
        assert "Too many failed sign-ins" in response.content.decode()
        assert 1 <= int(response["Retry-After"]) <= 60
        assert "_auth_user_id" not in response.wsgi_request.session


def test_a_right_password_under_the_limit_signs_in(db: Any, limit: int) -> None:
    User.objects.create_user("rita", password="the-right-password-1")
    for _ in range(limit - 1):
        sign_in("wrong")
    response = sign_in("the-right-password-1")
    assert response.status_code == 302
    assert response.wsgi_request.user.get_username() == "rita"


@pytest.mark.django_db(transaction=True)
def test_failures_counted_by_another_server_process_count_here(server_url: str, settings: Any) -> None:
    # The server process runs with the default limit; this process uses the same one.
    limit = settings.QUICKSAVE_AUTH_FAILURES_PER_MINUTE
    with httpx.Client(base_url=server_url, headers={"Authorization": f"Bearer {BAD_KEY}"}) as api:
        for _ in range(limit):
            assert api.get("/api/v1/threads/").status_code == 401

    assert_throttled(threads_with(BAD_KEY, "127.0.0.1"))


def test_the_admin_sign_in_is_the_throttled_page(db: Any, limit: int) -> None:
    User.objects.create_superuser("root", password="right-password-123")
    client = Client(REMOTE_ADDR="10.0.0.9")

    response = client.post("/admin/login/?next=/admin/", {"username": "root", "password": "right-password-123"})
    assert response.status_code == 302
    assert response["Location"] == "/login/?next=/admin/"
    assert "_auth_user_id" not in client.session  # the admin's own form is not there to take a password

    for _ in range(limit):
        assert client.post("/login/", {"username": "root", "password": "wrong"}).status_code == 200
    assert client.post("/login/", {"username": "root", "password": "right-password-123"}).status_code == 429
