"""The Django admin is for staff accounts: a signed-in person without staff status (any Quicksave
role, admins included) gets a 403 page that says so, not a redirect to the sign-in page and back."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from tests.conftest import person, signed_in

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("role", [None, "viewer", "reviewer", "admin"])
@pytest.mark.parametrize("path", ["/admin/", "/admin/auth/user/", "/admin/login/?next=/admin/"])
def test_a_signed_in_person_without_staff_status_gets_a_403_page_from_the_django_admin(
    role: str | None, path: str
) -> None:
    browser = signed_in(person("nora", role))

    response = browser.get(path, follow=True)

    assert response.status_code == 403
    assert len(response.redirect_chain) <= 2, response.redirect_chain  # /admin/login/ goes by /login/
    page = response.content.decode()
    assert "Not allowed" in page and "staff" in page


def test_someone_signed_out_is_sent_to_the_sign_in_page_once(db: Any) -> None:
    response = Client().get("/admin/", follow=True)

    assert response.status_code == 200
    assert [url for url, _ in response.redirect_chain][-1] == "/login/?next=%2Fadmin%2F"
    assert response.templates[0].name == "registration/login.html"


def test_a_staff_account_reaches_the_django_admin(db: Any) -> None:
    staff = person("sam", None)
    staff.is_staff = staff.is_superuser = True
    staff.save()

    assert signed_in(staff).get("/admin/").status_code == 200
