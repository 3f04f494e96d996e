"""`manage.py seed_demo` starts the ADK concierge on its scripted model: its booking waits in the
inbox with a payload a person can edit, and a second run leaves it as it is."""

from __future__ import annotations

from io import StringIO

import google.adk  # noqa: F401  (a missing framework fails the run)
import pytest
from django.core.management import call_command

from approvals.models import ApprovalRequest, ApprovalStatus
from integrations.adk import demo
from integrations.adk.sessions import find_thread

pytestmark = pytest.mark.django_db(transaction=True)


def test_seed_demo_leaves_the_concierges_booking_waiting_in_the_inbox() -> None:
    call_command("seed_demo", "--no-run", stdout=StringIO())
    call_command("seed_demo", "--no-run", stdout=StringIO())

    thread = find_thread(demo.APP, demo.USER, demo.SESSION)
    assert thread is not None
    approval = ApprovalRequest.objects.get(thread_id=thread.pk)
    assert (approval.action, approval.status) == ("book_hotel", ApprovalStatus.PENDING)
    assert approval.args == {"hotel": "Albergo del Senato", "city": "Rome", "nights": 3}
