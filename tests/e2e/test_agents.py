"""An admin issues an agent key in Chromium, the agent writes with it, then the admin revokes it."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from quicksave_agents.models import AgentKey
from tests.e2e.conftest import Pages, make_person

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_an_admin_issues_a_key_shown_once_and_revokes_it_after_confirming(tab: Pages, server_url: str, db: Any) -> None:
    make_person("ada", "admin")
    tab.login("ada")
    tab.follow("nav >> text=Agents")
    assert tab.page.title() == "Agents · Quicksave"
    tab.page.fill("#f-agent", "billing")
    tab.page.fill("#f-label", "nightly run")
    tab.follow("#new-key button[type=submit]")

    plaintext = tab.page.locator("#plaintext-key").inner_text().strip()
    assert plaintext.startswith("qs_")
    tab.shot("key issued")
    with httpx.Client(base_url=server_url, headers={"Authorization": f"Bearer {plaintext}"}) as agent:
        assert agent.post("/api/v1/threads/", json={"external_id": "night-1"}).status_code == 201

    tab.follow("text=Done")
    prefix = AgentKey.objects.get(agent__name="billing").prefix
    row = tab.page.locator(f"tr[data-key='{prefix}']")
    assert "nightly run" in row.inner_text() and "Active" in row.inner_text()
    assert "never" not in row.inner_text()  # the agent used it a moment ago
    assert plaintext not in tab.page.content()
    tab.follow(f"tr[data-key='{prefix}'] >> text=Revoke…")
    assert "billing has no other active key" in tab.page.locator("#action").inner_text()
    tab.shot("revoke confirm")
    tab.follow("#confirm-revoke")

    assert f"Key {prefix} of billing is revoked" in tab.page.locator(".flash").inner_text()
    assert "Revoked" in tab.page.locator(f"tr[data-key='{prefix}']").inner_text()
    tab.shot("revoked")
    with httpx.Client(base_url=server_url, headers={"Authorization": f"Bearer {plaintext}"}) as agent:
        assert agent.get("/api/v1/threads/").status_code == 401
