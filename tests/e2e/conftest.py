"""Browser tests: Debian's Chromium driven by Playwright against a real ASGI server (uvicorn,
with websockets) running on the test database in its own process.

Screenshots of every page a test visits go to $QUICKSAVE_TEST_OUTPUT (default: test-output/)
under screenshots/. Any console error or failed request on a page fails the test.
"""

from __future__ import annotations

import os
import re
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User

from quicksave.roles import grant_role
from tests.conftest import password_hash

CHROMIUM = os.environ.get("QUICKSAVE_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
]
OUTPUT = Path(os.environ.get("QUICKSAVE_TEST_OUTPUT", Path(__file__).resolve().parents[2] / "test-output"))
PASSWORD = "correct-horse-battery-9"

pytestmark = pytest.mark.browser

# Playwright's sync API leaves its event loop marked as running on the main thread between calls
# (it runs only while a call waits), so Django takes the ORM calls these tests make between browser
# calls for calls from async code and refuses them. The check is switched off for each browser
# test alone, from its setup to the end of its teardown (pytest-django empties the tables then),
# never for the other tests of the run, nor for the server they browse (tests.processes.start_server).
ASYNC_UNSAFE = "DJANGO_ALLOW_ASYNC_UNSAFE"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, None, None]:
    os.environ[ASYNC_UNSAFE] = "true"
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Generator[None, None, None]:
    try:
        return (yield)
    finally:
        os.environ.pop(ASYNC_UNSAFE, None)


# Per package, not per session: while Playwright's sync API runs it keeps an event loop
# running on the main thread, which would break the async tests collected after these. pytest
# stops it when the run leaves tests/e2e/ (whose tests all run together, as transactional tests),
# so one Chromium serves every module here; each test still gets a fresh context (`tab`).
@pytest.fixture(scope="package")
def browser() -> Iterator[Any]:
    if not os.access(CHROMIUM, os.X_OK):
        # A failure, not a skip: CI must not pass with the browser tests unrun.
        pytest.fail(f"Chromium is not installed at {CHROMIUM}: apt-get install chromium, or set QUICKSAVE_CHROMIUM",
                    pytrace=False)  # fmt: skip
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


class Pages:
    """A signed-in browser tab that records console errors and saves screenshots."""

    def __init__(self, page: Any, base_url: str, name: str) -> None:
        self.page = page
        self.base_url = base_url
        self.name = name
        self.errors: list[str] = []
        page.on("console", self._console)
        page.on("pageerror", lambda error: self.errors.append(str(error)))
        page.on("requestfailed", lambda request: self.errors.append(f"failed: {request.url}"))

    def _console(self, message: Any) -> None:
        if message.type == "error":
            self.errors.append(message.text)

    def goto(self, path: str) -> Any:
        return self.page.goto(self.base_url + path)

    def follow(self, selector: str) -> None:
        """Click a link or submit button and wait for the page it leads to."""
        with self.page.expect_navigation():
            self.page.click(selector)

    def press(self, key: str) -> None:
        """Press a key that navigates (j/k) and wait for the page it leads to."""
        with self.page.expect_navigation():
            self.page.keyboard.press(key)

    def login(self, username: str, password: str = PASSWORD) -> None:
        self.goto("/login/")
        self.page.fill("#id_username", username)
        self.page.fill("#id_password", password)
        self.page.click("button[type=submit]")
        self.page.wait_for_load_state()

    def shot(self, label: str) -> Path:
        folder = OUTPUT / "screenshots"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{self.name}--{re.sub(r'[^a-z0-9]+', '-', label.lower())}.png"
        self.page.screenshot(path=str(path), full_page=True)
        return path


@pytest.fixture(params=["light", "dark"])
def tab(request: Any, browser: Any, server_url: str) -> Iterator[Pages]:
    context = browser.new_context(viewport={"width": 1280, "height": 900}, color_scheme=request.param)
    page = context.new_page()
    pages = Pages(page, server_url, f"{request.node.originalname}-{request.param}")
    yield pages
    context.close()
    assert pages.errors == [], f"console errors: {pages.errors}"


def make_person(username: str, role: str | None) -> User:
    user = User.objects.create(username=username, password=password_hash(PASSWORD))
    if role:
        grant_role(user=user, role=role)
    return user
