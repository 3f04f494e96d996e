"""Chromium loads every main page under the strict Content-Security-Policy without a single violation:
no inline style or script is left for the browser to refuse."""

from __future__ import annotations

from typing import Any

import pytest

from approvals.models import ApprovalRequest, ApprovalStatus
from checkpoints.models import Checkpoint
from quicksave_agents.demo import TravelAgent
from quicksave_agents.runtime import start_thread
from quicksave_agents.worker import Worker
from tests.e2e.conftest import Pages, make_person

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

# Reported to the console as well, with what was refused and where.
REPORT_VIOLATIONS = """
document.addEventListener("securitypolicyviolation", (event) => {
  console.error(`securitypolicyviolation: ${event.violatedDirective} blocked ${event.blockedURI}`
                + ` at ${event.sourceFile}:${event.lineNumber}`);
});
"""


def violations(tab: Pages) -> list[str]:
    return [text for text in tab.errors if "Content Security Policy" in text or "securitypolicyviolation" in text]


@pytest.mark.parametrize("tab", ["light"], indirect=True)
def test_the_main_pages_load_without_a_content_security_policy_violation(tab: Pages, db: Any) -> None:
    make_person("ada", "admin")
    thread = start_thread(agent_class=TravelAgent, external_id="trip-csp", destination="FCO")
    worker = Worker(name="e2e-worker")
    while worker.run_once():
        pass
    approval = ApprovalRequest.objects.get(thread=thread, status=ApprovalStatus.PENDING)
    checkpoint = Checkpoint.objects.filter(thread=thread).order_by("-seq").first()
    assert checkpoint is not None
    tab.page.add_init_script(REPORT_VIOLATIONS)

    tab.goto("/login/")
    assert "Content-Security-Policy" not in (tab.page.content())  # a header, not a meta tag
    tab.page.wait_for_load_state("load")
    tab.shot("login")
    tab.login("ada")
    pages = {
        "threads": "/",
        "thread": f"/threads/{thread.pk}/",
        "checkpoint": f"/checkpoints/{checkpoint.pk}/",
        "diff": f"/checkpoints/{checkpoint.pk}/diff/",
        "inbox": "/inbox/",
        "approval": f"/inbox/{approval.pk}/",
        "agents": "/agents/",
        "audit": "/audit/",
        "api docs": "/api/docs/",
    }
    for label, path in pages.items():
        response = tab.goto(path)
        assert response.status == 200, (path, response.status)
        assert "script-src 'self'" in response.headers["content-security-policy"]
        tab.page.wait_for_load_state("load")
        # A violation is something that must not happen: it takes a window. The live socket
        # connects and the scripts run within it.
        tab.page.wait_for_timeout(300)
        if label in ("threads", "checkpoint", "api docs"):
            tab.shot(label)
        assert violations(tab) == [], (path, violations(tab))
    assert tab.page.locator(".swagger-ui .info .title").inner_text().startswith("Quicksave API")

    # The listener works: an inline style added now is refused and reported.
    reported = tab.page.expect_console_message(lambda message: "securitypolicyviolation" in message.text,
                                               timeout=5_000)  # fmt: skip
    with reported:
        tab.page.evaluate("document.head.insertAdjacentHTML('beforeend', '<style>body { color: red }</style>')")
    assert violations(tab), "an inline style went unreported"
    tab.errors.clear()
