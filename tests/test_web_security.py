"""Web security: CSRF on session calls, the production profile's cookies, headers and `check --deploy`,
websocket origins, and no key or state in the logs."""

from __future__ import annotations

import base64
import json
import logging
import os
import secrets
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import User
from django.test import Client

from checkpoints import storage
from checkpoints.models import Thread
from quicksave_agents.keys import create_agent_key, get_or_create_agent
from tests.conftest import person
from tests.processes import ROOT, database_url

# --------------------------------------------------------------------------- CSRF


def test_a_session_api_call_without_the_csrf_token_is_refused_in_the_error_format(db: Any) -> None:
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(person("ada", "admin"))
    get_or_create_agent(name="travel")
    body = json.dumps({"agent": "travel"})

    refused = browser.post("/api/v1/threads/", data=body, content_type="application/json")

    assert refused.status_code == 403
    error = refused.json()["error"]
    assert (error["code"], error["detail"]) == ("permission_denied", {})
    assert "CSRF" in error["message"]
    assert not Thread.objects.exists()

    browser.get("/")  # a page with a form sets the CSRF cookie
    token = browser.cookies["csrftoken"].value
    accepted = browser.post("/api/v1/threads/", data=body, content_type="application/json", HTTP_X_CSRFTOKEN=token)
    assert accepted.status_code == 201, accepted.content


def test_an_agent_key_call_needs_no_csrf_token(owner_client: Any) -> None:
    owner_client.enforce_csrf_checks = True
    assert owner_client.post("/api/v1/threads/", data="{}", content_type="application/json").status_code == 201


@pytest.mark.parametrize("path", ["/login/", "/logout/"])
def test_a_form_post_without_the_csrf_token_is_refused(db: Any, path: str) -> None:
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(person("ada", "admin"))
    assert browser.post(path, {"username": "ada", "password": "ada-password-1"}).status_code == 403


# --------------------------------------------------------------------------- production profile

HOST = "quicksave.example.com"


@pytest.fixture
def production_env(tmp_path: Path) -> dict[str, str]:
    """The environment of a production deployment behind HTTPS, against the test database."""
    return {
        **os.environ,
        "DATABASE_URL": database_url(),
        "DEBUG": "false",
        "SECRET_KEY": secrets.token_urlsafe(50),
        "QUICKSAVE_REQUIRE_SECRET_KEY": "true",
        "QUICKSAVE_ENCRYPTION_KEYS": "prod-1:" + base64.b64encode(secrets.token_bytes(32)).decode(),
        "QUICKSAVE_VAR_DIR": str(tmp_path),
        "QUICKSAVE_EMBEDDED_WORKER": "false",
        "QUICKSAVE_TESTING": "0",
        "ALLOWED_HOSTS": HOST,
        "CSRF_TRUSTED_ORIGINS": f"https://{HOST}",
        "SECURE_SSL_REDIRECT": "true",
        "SECURE_HSTS_SECONDS": "31536000",
        "SECURE_HSTS_INCLUDE_SUBDOMAINS": "true",
        "SECURE_HSTS_PRELOAD": "true",
        "SESSION_COOKIE_SECURE": "true",
        "CSRF_COOKIE_SECURE": "true",
    }


def manage(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )


def test_check_deploy_is_clean_in_the_production_profile(db: Any, production_env: dict[str, str]) -> None:
    result = manage(production_env, "check", "--deploy", "--fail-level", "WARNING")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "System check identified no issues" in result.stdout


def test_check_deploy_fails_without_the_https_settings(db: Any, production_env: dict[str, str]) -> None:
    env = {**production_env, "SECURE_SSL_REDIRECT": "false", "SESSION_COOKIE_SECURE": "false"}
    result = manage(env, "check", "--deploy", "--fail-level", "WARNING")
    assert result.returncode != 0
    assert "security.W008" in result.stderr and "security.W012" in result.stderr


# Run inside the production profile: plain http is redirected; over https, a sign-in answers with
# the security headers and secure cookies.
_PROBE = f"""
import json
from django.test import Client
browser = Client(HTTP_HOST="{HOST}")
plain = browser.get("/login/")
page = browser.get("/login/", secure=True)
signed_in = browser.post("/login/", {{"username": "rita", "password": "rita-password-1"}}, secure=True)
cookie = lambda response, name: dict(response.cookies[name].items()) if name in response.cookies else None
print("PROBE" + json.dumps({{
    "plain": [plain.status_code, plain.get("Location")],
    "headers": {{name: page.get(name) for name in ("Strict-Transport-Security", "X-Content-Type-Options",
                "X-Frame-Options", "Referrer-Policy", "Cross-Origin-Opener-Policy")}},
    "signed_in": signed_in.status_code,
    "csrftoken": cookie(page, "csrftoken"),
    "sessionid": cookie(signed_in, "sessionid"),
}}))
"""


@pytest.mark.django_db(transaction=True)
def test_the_production_profile_sends_security_headers_and_secure_cookies(production_env: dict[str, str]) -> None:
    User.objects.create_user("rita", password="rita-password-1")

    result = manage(production_env, "shell", "-c", _PROBE)

    assert result.returncode == 0, result.stderr
    probe = json.loads(result.stdout.split("PROBE", 1)[1])
    assert probe["plain"] == [301, f"https://{HOST}/login/"]
    assert probe["headers"] == {
        "Strict-Transport-Security": "max-age=31536000; includeSubDomains; preload",
        "X-Content-Type-Options": "nosniff",
        "X-Frame-Options": "DENY",
        "Referrer-Policy": "same-origin",
        "Cross-Origin-Opener-Policy": "same-origin",
    }
    assert probe["signed_in"] == 302
    for name in ("csrftoken", "sessionid"):
        assert probe[name]["secure"] is True, (name, probe[name])
        assert probe[name]["samesite"] == "Lax", (name, probe[name])
    assert probe["sessionid"]["httponly"] is True


# --------------------------------------------------------------------------- websocket origins


@pytest.fixture
def websocket_app(settings: Any) -> Any:
    """The websocket stack exactly as quicksave/asgi.py serves it (origin validator included)."""
    settings.QUICKSAVE_EMBEDDED_WORKER = False
    from quicksave.asgi import websocket_app

    return websocket_app


def _thread_and_key() -> tuple[Thread, str]:
    agent = get_or_create_agent(name="travel")
    thread, _ = storage.create_thread(agent=agent)
    return thread, create_agent_key(agent=agent)[1]


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("origin", "accepted"),
    [
        (b"http://127.0.0.1:8000", True),
        (b"http://localhost", True),
        (b"https://evil.example", False),
        (b"http://127.0.0.1.evil.example", False),
        (b"null", False),
        (None, False),
    ],
)
async def test_websockets_accept_only_our_own_origins(websocket_app: Any, origin: bytes | None, accepted: bool) -> None:
    thread, key = await sync_to_async(_thread_and_key)()
    headers = [(b"host", b"127.0.0.1"), (b"authorization", f"Bearer {key}".encode())]
    if origin is not None:
        headers.append((b"origin", origin))
    communicator = WebsocketCommunicator(websocket_app, f"/ws/threads/{thread.pk}/", headers=headers)

    connected, _ = await communicator.connect()

    assert connected is accepted
    await communicator.disconnect()


# --------------------------------------------------------------------------- logs

SECRET = "sk-live-" + "4f9a2c" * 6


def test_keys_and_state_never_reach_the_logs(owner_client: Any, agent_key: str, caplog: Any) -> None:
    caplog.set_level(logging.DEBUG)
    for name in ("django", "django.request", "django.server", "django.security", "django.db.backends"):
        caplog.set_level(logging.DEBUG, logger=name)

    def post(path: str, body: Any) -> Any:
        return owner_client.post(path, data=json.dumps(body), content_type="application/json")

    thread = post("/api/v1/threads/", {"metadata": {"customer": "acme"}}).json()
    url = f"/api/v1/threads/{thread['id']}/checkpoints/"
    state = {"credentials": {"api_key": SECRET}, "note": f"use {SECRET} for payments"}
    first = post(url, {"parent": None, "state": state}).json()
    responses = [
        owner_client.get(f"/api/v1/checkpoints/{first['id']}/"),  # 200 with the state
        post(url, {"parent": None, "state": state}),  # 409 stale parent: logged as a warning
        post(url, {"parent": first["id"], "state": state, "secret": SECRET}),  # 400 unknown field
        post(f"/api/v1/threads/{thread['id']}/tool-results/pay/", {"result": SECRET}),  # 405
        owner_client.get("/api/v1/checkpoints/00000000-0000-0000-0000-000000000000/"),  # 404
    ]
    wrong_key = Client(HTTP_AUTHORIZATION=f"Bearer {agent_key}x")  # 401 with (almost) the key
    responses.append(wrong_key.get("/api/v1/threads/"))

    assert [r.status_code for r in responses] == [200, 409, 400, 405, 404, 401]
    assert any(record.name == "django.request" for record in caplog.records)  # the capture works
    for record in caplog.records:
        text = f"{record.getMessage()} {record.exc_text or ''} {vars(record)}"
        assert agent_key not in text, record
        assert agent_key.rsplit("_", 1)[1] not in text, record  # nor the key's secret part
        assert SECRET not in text, record
