"""Browsers ask for /favicon.ico on pages that link no icon (the Django admin's)."""

from __future__ import annotations

from django.test import Client


def test_favicon_ico_points_at_the_dashboard_icon() -> None:
    response = Client().get("/favicon.ico")
    assert response.status_code == 301
    assert response["Location"] == "/static/favicon.svg"
