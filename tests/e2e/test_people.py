"""People in Chromium: an admin adds a teammate, who signs in with the temporary password, is asked
to choose their own, and lands on the dashboard."""

from __future__ import annotations

from typing import Any

import pytest

from tests.e2e.conftest import Pages, make_person

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

CHOSEN = "tom-chose-this-one-77"


def test_an_admin_adds_a_teammate_who_chooses_a_password_and_sees_the_dashboard(
    tab: Pages, browser: Any, server_url: str
) -> None:
    make_person("ada", "admin")
    tab.login("ada")
    tab.follow("#nav-people")
    tab.follow("#add-person")
    tab.page.fill("#id_username", "tom")
    tab.page.select_option("#id_role", "reviewer")
    tab.shot("add a person")
    tab.follow("#create-person")
    password = tab.page.inner_text("#temporary-password").strip()
    assert tab.page.inner_text("#new-username") == "tom"
    tab.shot("password shown once")

    context = browser.new_context(viewport={"width": 1280, "height": 900})
    try:
        teammate = Pages(context.new_page(), server_url, f"{tab.name}-teammate")
        teammate.login("tom", password)
        assert teammate.page.url == f"{server_url}/password/"
        assert teammate.page.inner_text("h1") == "Choose your password"
        teammate.shot("choose a password")
        # Anywhere else first sends them back.
        teammate.goto("/inbox/")
        assert teammate.page.url == f"{server_url}/password/?next=%2Finbox%2F"
        teammate.page.fill("#id_new_password1", CHOSEN)
        teammate.page.fill("#id_new_password2", CHOSEN + "!")
        teammate.follow("#save-password")
        assert "didn\u2019t match" in teammate.page.inner_text("#field-new_password2")
        teammate.errors.clear()  # the 400 answer to the mismatch is itself logged by Chromium
        teammate.page.fill("#id_new_password1", CHOSEN)
        teammate.page.fill("#id_new_password2", CHOSEN)
        teammate.follow("#save-password")

        assert teammate.page.url == f"{server_url}/inbox/"
        teammate.follow("a.brand")
        assert teammate.page.inner_text("h1") == "Threads"
        assert teammate.page.inner_text(".user .role").lower() == "reviewer"  # capitalised by CSS
        teammate.shot("dashboard")
        assert teammate.errors == [], teammate.errors
    finally:
        context.close()

    tab.goto("/people/")
    assert "Active" in tab.page.inner_text('tr[data-person="tom"]')


def test_the_people_pages_fit_a_phone(browser: Any, server_url: str) -> None:
    ada = make_person("ada", "admin")
    context = browser.new_context(viewport={"width": 390, "height": 844})
    try:
        phone = Pages(context.new_page(), server_url, "people-phone")
        phone.login("ada")
        for path in ["/people/", "/people/new/", f"/people/{ada.pk}/", f"/people/{ada.pk}/deactivate/", "/password/"]:
            phone.goto(path)
            wide = phone.page.evaluate("document.scrollingElement.scrollWidth - document.scrollingElement.clientWidth")
            assert wide <= 0, f"{path} scrolls sideways by {wide}px"
        phone.shot("person")
        assert phone.errors == [], phone.errors
    finally:
        context.close()
