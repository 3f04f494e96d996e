"""Every page carries a strict Content-Security-Policy (no inline script or style, nothing from another
origin), so templates and the HTML that Python renders hold no style= attribute, inline <script> or
on*= handler; the API schema and docs are for signed-in people and agent keys only."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from tests.conftest import person, signed_in

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[1]

POLICY = {
    "default-src": "'self'",
    "script-src": "'self'",
    "style-src": "'self'",
    "img-src": "'self' data:",
    "connect-src": "'self' ws://testserver wss://testserver",
    "frame-ancestors": "'none'",
    "base-uri": "'none'",
    "form-action": "'self'",
    "object-src": "'none'",
}


def directives(header: str) -> dict[str, str]:
    return dict(part.strip().partition(" ")[::2] for part in header.split(";"))


@pytest.mark.parametrize("path", ["/", "/inbox/", "/audit/", "/agents/", "/api/docs/", "/no-such-page/"])
def test_every_page_carries_the_strict_policy(path: str) -> None:
    admin = signed_in(person("ada", "admin"))

    response = admin.get(path)

    assert response.status_code in (200, 404)
    assert directives(response["Content-Security-Policy"]) == POLICY
    assert "unsafe" not in response["Content-Security-Policy"]


def test_the_signed_out_sign_in_page_carries_it_too(db: Any) -> None:
    assert directives(Client().get("/login/")["Content-Security-Policy"]) == POLICY


INLINE = re.compile(r"""\sstyle\s*=|<style[\s>]|<script(?![^>]*\ssrc=)[^>]*>|\son[a-z]+\s*=""", re.IGNORECASE)


def test_no_template_holds_an_inline_style_script_or_event_handler() -> None:
    offending = []
    for template in sorted((ROOT / "templates").rglob("*.html")):
        for number, line in enumerate(template.read_text().splitlines(), 1):
            if INLINE.search(line):
                offending.append(f"{template.relative_to(ROOT)}:{number}: {line.strip()}")
    assert offending == []


@pytest.mark.parametrize("package", ["checkpoints", "approvals", "agents", "quicksave"])
def test_no_python_module_renders_a_style_attribute(package: str) -> None:
    offending = []
    for module in sorted((ROOT / package).rglob("*.py")):
        for number, line in enumerate(module.read_text().splitlines(), 1):
            if re.search(r"""\bstyle=\\?["']|<style|\son(click|load|error)=""", line):
                offending.append(f"{module.relative_to(ROOT)}:{number}: {line.strip()}")
    assert offending == []


# --------------------------------------------------------------------------- schema and docs


def test_the_schema_and_docs_are_refused_to_someone_signed_out(db: Any) -> None:
    browser = Client()

    schema = browser.get("/api/schema/", {"format": "json"})
    docs = browser.get("/api/docs/")

    assert schema.status_code in (401, 403)
    assert schema.json()["error"]["code"] in ("not_authenticated", "permission_denied")
    assert docs.status_code == 302 and docs["Location"] == "/login/?next=/api/docs/"


def test_an_agent_key_reads_the_schema(owner_client: Any) -> None:
    response = owner_client.get("/api/schema/", {"format": "json"})

    assert response.status_code == 200
    assert "/api/v1/threads/" in response.json()["paths"]


def test_the_docs_page_loads_its_script_and_styles_from_urls(db: Any) -> None:
    viewer = signed_in(person("vic", "viewer"))

    page = viewer.get("/api/docs/").content.decode()
    script = viewer.get("/api/docs/", {"script": ""})

    assert not INLINE.search(page), page
    assert 'src="/api/docs/?script="' in page and "css/swagger.css" in page
    assert script.status_code == 200 and script["Content-Type"].startswith("application/javascript")
    assert "SwaggerUIBundle" in script.content.decode()
