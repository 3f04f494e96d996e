"""Signing in in Chromium: the Django admin sends people to the dashboard's (throttled) sign-in page."""

from __future__ import annotations

import pytest

from tests.e2e.conftest import PASSWORD, Pages, make_person

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_an_admin_opening_the_admin_signs_in_on_the_dashboard_page_by_keyboard(tab: Pages) -> None:
    admin = make_person("ada", "admin")
    admin.is_staff = True
    admin.save(update_fields=["is_staff"])

    tab.goto("/admin/")
    assert tab.page.url.endswith("/login/?next=/admin/")
    tab.shot("sign in")
    tab.page.focus("#id_username")
    tab.page.keyboard.type("ada")
    tab.page.keyboard.press("Tab")
    tab.page.keyboard.type(PASSWORD)
    tab.press("Enter")
    assert tab.page.url.endswith("/admin/")
    assert "Site administration" in tab.page.content()
