"""A LangGraph graph's interrupt waits in the inbox; a reviewer approves it in Chromium, the
server's own worker resumes the graph, and the graph's next checkpoints appear on the thread page."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from uuid import uuid4

import pytest
from langchain_core.runnables import RunnableConfig

from approvals.models import ApprovalRequest, ApprovalStatus
from checkpoints.models import Checkpoint, Thread
from integrations.langgraph.saver import QuicksaveSaver
from tests.e2e.conftest import Pages, make_person
from tests.integrations.graphs import BOOKING, booking_graph

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture(scope="module")
def server_url(django_db_setup: Any) -> Iterator[str]:
    """A server of its own whose embedded worker runs the test graphs: this module's tests leave
    the resume to the server, where the other browser tests drive a worker themselves."""
    from tests.processes import free_port, start_server, stop

    port = free_port()
    process = start_server(
        port, {"QUICKSAVE_EMBEDDED_WORKER": "true", "QUICKSAVE_AGENT_MODULES": "tests.integrations.graphs"}
    )
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        stop(process)


def test_approving_a_graphs_interrupt_in_the_inbox_resumes_the_graph_onto_its_timeline(tab: Pages) -> None:
    make_person("rita", "reviewer")
    config: RunnableConfig = {"configurable": {"thread_id": f"trip-{uuid4().hex[:8]}"}}
    graph = booking_graph(QuicksaveSaver(agent=BOOKING))
    graph.invoke({"destination": "Lisbon"}, config)
    thread = Thread.objects.get(agent__name=BOOKING, external_id=config["configurable"]["thread_id"])
    approval = ApprovalRequest.objects.get(thread=thread, status=ApprovalStatus.PENDING)
    waiting_seq = Checkpoint.objects.filter(thread=thread).order_by("-seq").values_list("seq", flat=True)[0]

    tab.login("rita")
    tab.goto("/inbox/")
    row = tab.page.locator(f"tr[data-approval='{approval.pk}']")
    assert "book_flight" in row.inner_text()
    tab.follow(f"tr[data-approval='{approval.pk}'] a >> nth=0")
    assert tab.page.locator("#agent-message").inner_text() == "Book TP1350 to Lisbon?"
    tab.shot("langgraph approval")

    tab.page.click("#approve")  # high risk: the dialog shows the arguments first
    assert "TP1350" in tab.page.locator("#confirm-approve").inner_text()
    tab.follow("#confirm-approve-yes")
    assert "Approved" in tab.page.locator("#decision").inner_text()

    tab.goto(f"/threads/{thread.pk}/")
    # The server's worker resumes the graph: `approve` and then `book` each end with a checkpoint.
    tab.page.wait_for_selector(f"#timeline tbody tr[data-seq='{waiting_seq + 2}']", timeout=30_000)
    assert "loop" in tab.page.locator(f"#timeline tbody tr[data-seq='{waiting_seq + 2}']").inner_text()
    tab.shot("langgraph resumed")
    state = graph.get_state(config)
    assert state.values["booked"] == "TP1350"
    assert state.values["decision"]["decided_by"] == "rita"
