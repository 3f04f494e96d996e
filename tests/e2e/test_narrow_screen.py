"""Every page works on a phone: at 390 x 844 no page scrolls sideways (wide tables scroll inside
their own box, filter forms fold), and none logs a console error.

The pages are every GET page of the permission matrix (tests/test_permission_matrix.py) that an
admin may open, filled from its world, every page of the URL conf that takes no argument, and the
seeded demo's threads, checkpoints, diffs and requests: a page added later is covered once it joins
the matrix (as every new route must).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver

from approvals.models import ApprovalRequest
from checkpoints import storage
from checkpoints.models import Thread
from quicksave_agents.keys import get_or_create_agent
from tests.e2e.conftest import Pages, make_person
from tests.processes import ROOT, database_url, server_environment
from tests.test_permission_matrix import PAGES, PRINCIPALS, build_world

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True), pytest.mark.timeout(600)]

WIDTH, HEIGHT = 390, 844
# Not Quicksave's pages: the API, Django's admin, machine endpoints, and sign-out (a POST).
NOT_PAGES = ("api/", "admin/", "healthz", "metrics", "favicon.ico", "logout/", "login/", "ws/")
ADMIN_COLUMN = PRINCIPALS.index("admin")

# The element that sticks out furthest, to name in a failure.
WIDEST = """() => {
  const clipped = (element) => {
    for (let up = element.parentElement; up && up !== document.body; up = up.parentElement) {
      if (["auto", "scroll", "hidden", "clip"].includes(getComputedStyle(up).overflowX)) return true;
    }
    return false;
  };
  const out = [];
  for (const element of document.querySelectorAll("body *")) {
    const box = element.getBoundingClientRect();
    if (box.right > innerWidth + 0.5 && box.width > 0 && !clipped(element)) {
      const name = element.tagName.toLowerCase() + (element.id ? "#" + element.id : "") +
        (element.classList.length ? "." + [...element.classList].join(".") : "");
      out.push(`${name} right=${Math.round(box.right)}`);
    }
  }
  return out.slice(0, 8);
}"""


def url_conf_pages() -> list[str]:
    """Every path of the URL conf that takes no argument and is a page."""

    def walk(patterns: list[Any], prefix: str) -> Iterator[str]:
        for pattern in patterns:
            route = str(pattern.pattern).lstrip("^").rstrip("$")
            if isinstance(pattern, URLResolver):
                yield from walk(pattern.url_patterns, prefix + route)
            elif isinstance(pattern, URLPattern):
                yield prefix + route

    return sorted(
        "/" + path
        for path in walk(get_resolver().url_patterns, "")
        if not any(mark in path for mark in "<(?\\") and not path.startswith(NOT_PAGES)
    )


def demo_pages() -> list[str]:
    # In a process of its own: the framework demos run async code, and Playwright's loop runs in this thread.
    subprocess.run([sys.executable, "manage.py", "seed_demo"], cwd=ROOT, check=True, capture_output=True, timeout=300,
                   env={**server_environment(), "DATABASE_URL": database_url()})  # fmt: skip
    paths = []
    for thread in Thread.objects.filter(agent__name__startswith="demo-").order_by("created_at")[:4]:
        paths += [f"/threads/{thread.pk}/", f"/checkpoints/{thread.head_id}/", f"/checkpoints/{thread.head_id}/diff/"]
    approval = ApprovalRequest.objects.filter(thread__agent__name__startswith="demo-").first()
    assert approval is not None
    return [*paths, f"/inbox/{approval.pk}/"]


@pytest.fixture
def phone(browser: Any, server_url: str) -> Iterator[Pages]:
    context = browser.new_context(viewport={"width": WIDTH, "height": HEIGHT}, is_mobile=True, has_touch=True,
                                  device_scale_factor=1)  # fmt: skip
    pages = Pages(context.new_page(), server_url, "narrow")
    yield pages
    context.close()


def test_no_page_scrolls_sideways_at_390_px(phone: Pages) -> None:
    world = build_world()
    matrix = [world.fill(path) for method, path, _, expected in PAGES
              if method == "GET" and expected[ADMIN_COLUMN] == 200]  # fmt: skip
    ada = make_person("ada", "admin")
    client = Client()
    client.force_login(ada)
    # The pages: what answers an admin's GET with 200 (a POST-only route answers 405, a redirect 302).
    candidates = dict.fromkeys([*matrix, *url_conf_pages(), *demo_pages(), "/api/docs/"])
    paths = [path for path in candidates if client.get(path).status_code == 200]
    phone.login("ada")

    visited, wide, errors = [], {}, {}
    for path in paths:
        phone.errors.clear()
        response = phone.goto(path)
        assert response is not None and response.status == 200, path
        phone.page.wait_for_load_state("networkidle")
        if path == "/api/docs/":
            phone.page.wait_for_selector(".swagger-ui .opblock", timeout=30_000)
        visited.append(path)
        width = phone.page.evaluate("document.scrollingElement.scrollWidth")
        if width > WIDTH:
            wide[path] = (width, phone.page.evaluate(WIDEST))
            phone.shot(f"too wide {path}")
        if phone.errors:
            errors[path] = list(phone.errors)

    assert len(visited) >= len(matrix), f"only {visited} opened"
    assert wide == {}, f"pages wider than {WIDTH} px: {wide}"
    assert errors == {}, f"console errors: {errors}"
    phone.errors.clear()


def test_on_a_phone_the_filters_fold_behind_a_button_that_counts_them(phone: Pages) -> None:
    make_person("ada", "admin")
    storage.create_thread(agent=get_or_create_agent(name="travel"), external_id="trip-narrow")
    phone.login("ada")

    phone.goto("/?status=failed&q=customer:acme")
    toggle = phone.page.locator("button.filters-toggle")
    form = phone.page.locator("form.filters")
    assert toggle.inner_text() == "Filters · 2 set"
    assert form.is_hidden() and toggle.get_attribute("aria-expanded") == "false"
    toggle.click()
    assert form.is_visible() and toggle.get_attribute("aria-expanded") == "true"
    assert phone.page.locator("#f-status").input_value() == "failed"
    phone.shot("filters open")

    phone.goto("/inbox/")
    assert phone.page.locator("form.filters").is_hidden()
    assert phone.page.locator("button.filters-toggle").is_visible()
    assert phone.errors == []


def test_on_a_wide_screen_the_filters_stay_open(tab: Pages) -> None:
    make_person("ada", "admin")
    storage.create_thread(agent=get_or_create_agent(name="travel"), external_id="trip-wide")
    tab.login("ada")
    tab.goto("/")

    assert tab.page.locator("form.filters").is_visible()
    assert tab.page.locator("button.filters-toggle").is_hidden()


@pytest.mark.parametrize("width", [1024, 1280, 1440])
def test_at_laptop_widths_a_staff_admins_header_fits_the_window(browser: Any, server_url: str, width: int) -> None:
    # The longest nav there is: an admin's links and Django's admin (staff only), with a pending approval's count.
    ada = make_person("ada", "admin")
    ada.is_staff = True
    ada.save(update_fields=["is_staff"])
    context = browser.new_context(viewport={"width": width, "height": 800})
    try:
        laptop = Pages(context.new_page(), server_url, f"laptop-{width}")
        laptop.login("ada")
        laptop.goto("/")

        nav_links = laptop.page.locator("nav.nav a")
        assert nav_links.last.inner_text() == "Django admin"
        assert laptop.page.evaluate("document.scrollingElement.scrollWidth") <= width, laptop.page.evaluate(WIDEST)
        # Every link and the sign-out button on one line of text.
        heights = laptop.page.evaluate("""() => [...document.querySelectorAll('nav.nav a, .user button')]
            .map((element) => element.getClientRects().length === 1 && element.getBoundingClientRect().height < 48)""")
        assert all(heights), laptop.shot("header wraps")
        assert laptop.errors == []
    finally:
        context.close()
