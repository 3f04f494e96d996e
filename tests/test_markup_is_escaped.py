"""Markup built from data goes through the template engine's autoescaping or `format_html`, never
around it: no `mark_safe`, `SafeString(...)`, `|safe`, `|safeseq` or `{% autoescape off %}` in the
application's code or templates."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
APPS = ("approvals", "audit", "checkpoints", "integrations", "notifications", "quicksave", "quicksave_agents")
BYPASSES = re.compile(r"\bmark_safe\b|\bSafeString\(|\|\s*safe(seq)?\b|\{%\s*autoescape\s+off\s*%\}")


def sources() -> list[Path]:
    code = [path for app in APPS for path in (ROOT / app).rglob("*.py")]
    templates = [path for path in (ROOT / "templates").rglob("*") if path.is_file()]
    templates += [path for app in APPS for path in (ROOT / app).rglob("templates/**/*") if path.is_file()]
    return code + templates


def test_no_code_or_template_marks_text_safe_by_hand() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in sources()
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if BYPASSES.search(line)
    ]
    assert found == []


def test_the_check_sees_each_bypass() -> None:
    for line in ("return mark_safe(html)", "SafeString(text)", "{{ value|safe }}", "{{ rows | safeseq }}",
                 "{% autoescape off %}"):  # fmt: skip
        assert BYPASSES.search(line), line
    assert not BYPASSES.search("format_html('<b>{}</b>', name)")
    assert len(sources()) > 50
