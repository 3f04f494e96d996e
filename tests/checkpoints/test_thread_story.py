"""The thread page tells the whole story: events (approvals, in-doubt calls, runs, forks, cancels,
resumes) among the checkpoints, a kind filter that pages without JavaScript, rewind from every row
and banner for those who may fork, pills that describe the checkpoint, one numbering, the branch
tree and chart folded below, and a warning when a queued run waits for a worker nobody runs."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.utils import timezone

from approvals.services import decide, request_approval
from checkpoints import forks, storage
from checkpoints.models import Checkpoint, Event, Thread
from checkpoints.presentation import story
from quicksave_agents import runs
from quicksave_agents.models import Agent, Run, RunReason
from tests.checkpoints.test_thread_page import grow, timeline_seqs, url
from tests.conftest import person


def event_types(html: str) -> list[str]:
    return re.findall(r'<tr data-event="\d+" class="story story-\w+" data-type="([\w.]+)"', html)


def row_kinds(html: str) -> list[str]:
    """The timeline's rows in order: "#<seq>" for a checkpoint, the event type for an event."""
    return [
        f"#{seq}" if seq else kind
        for seq, kind in re.findall(r'<tr data-(?:seq="(\d+)"|event="\d+" class="[^"]*" data-type="([\w.]+)")', html)
    ]


@pytest.fixture
def ada(db: Any) -> User:
    return person("ada", "admin")


@pytest.fixture
def admin_client(ada: User) -> Client:
    client = Client()
    client.force_login(ada)
    return client


@pytest.fixture
def viewer_page(db: Any) -> Client:
    client = Client()
    client.force_login(person("olivia", "viewer"))
    return client


def age(run: Run, seconds: float) -> None:
    Run.objects.filter(pk=run.pk).update(created_at=timezone.now() - timedelta(seconds=seconds))


# --------------------------------------------------------------------------- the story among the checkpoints


def test_approval_run_fork_and_cancel_are_told_between_the_checkpoints_with_who_and_why(
    admin_client: Client, thread: Thread, agent: Agent, ada: User
) -> None:
    first, second = grow(thread, 2)
    rex = person("rex", "reviewer")
    approval = request_approval(thread=thread, checkpoint=second, action="book_flight", args={"flight": "AZ611"})
    decide(approval=approval, user=rex, decision="approve", comment="price is within the trip budget")
    run = runs.claim_run(agents=[agent], worker="worker-7")
    assert run is not None
    runs.finish_run(run=run, worker="worker-7", status="failed", error="KeyError: 'phase'")
    forks.fork(checkpoint=first, user=ada, reason="retry without the flight", patch=[], branch="retry",
               resume=False, carry_approval=None)  # fmt: skip
    forks.cancel(thread=thread, user=ada, reason="customer called it off")

    html = admin_client.get(url(thread, "branch=main")).content.decode()

    assert row_kinds(html) == [
        "thread.cancelled", "branch.forked", "branch.created", "run.failed", "run.claimed", "run.queued",
        "approval.decided", "approval.requested", "#2", "#1", "thread.created",
    ]  # fmt: skip
    decided = re.search(r'data-type="approval.decided".*?</tr>', html, re.S).group(0)  # type: ignore[union-attr]
    assert "Approval approved: book_flight" in decided
    assert '<span class="story-who">rex</span>' in decided
    assert "“price is within the trip budget”" in decided
    assert f'href="/inbox/{approval.pk}/"' in decided
    claimed = re.search(r'data-type="run.claimed".*?</tr>', html, re.S).group(0)  # type: ignore[union-attr]
    assert '<span class="story-who">worker-7</span>' in claimed
    assert "KeyError: &#x27;phase&#x27;" in html  # the run's error, escaped
    forked = re.search(r'data-type="branch.forked".*?</tr>', html, re.S).group(0)  # type: ignore[union-attr]
    assert "Rewound and branched retry from main" in forked and "“retry without the flight”" in forked
    assert "customer called it off" in html


def test_a_lost_lease_reads_as_a_lost_run(viewer_page: Client, thread: Thread, agent: Agent) -> None:
    (head,) = grow(thread, 1)
    queued = runs.enqueue_run(thread=thread, checkpoint=head, reason=RunReason.MANUAL)
    runs.claim_run(agents=[agent], worker="w1", lease_seconds=1)
    Run.objects.filter(pk=queued.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    runs.claim_run(agents=[agent], worker="w2")

    html = viewer_page.get(url(thread)).content.decode()

    assert "Run lost its worker; claimed again (attempt 2)" in html


def test_in_doubt_calls_are_named_as_such() -> None:
    event = story.StoryEvent(seq=3, type="approval.requested", created_at=timezone.now(),
                             data={"approval": "not-a-uuid", "action": "charge_card", "kind": "in_doubt",
                                   "agent": "travel"})  # fmt: skip
    (row,) = story.event_rows([event])
    assert row["title"] == "In-doubt tool call asked: charge_card"
    assert row["url"] == ""  # a malformed id in old event data makes no link


def test_an_older_page_shows_the_events_between_its_own_checkpoints(viewer_page: Client, thread: Thread) -> None:
    written = grow(thread, 30)
    storage.record_event(thread=thread, type="run.queued", data={"reason": "manual"})  # after #30
    more = grow(thread, 90, parent=written[-1])
    assert more[-1].seq == 120

    newest = viewer_page.get(url(thread)).content.decode()  # #120..#71
    middle = viewer_page.get(url(thread, "before_seq=71")).content.decode()  # #70..#21
    oldest = viewer_page.get(url(thread, "before_seq=21")).content.decode()  # #20..#1

    assert "run.queued" not in event_types(newest)
    assert event_types(middle) == ["run.queued"]
    kinds = row_kinds(middle)
    assert kinds[kinds.index("run.queued") - 1 : kinds.index("run.queued") + 2] == ["#31", "run.queued", "#30"]
    assert event_types(oldest) == ["thread.created"]
    assert timeline_seqs(middle) == list(range(70, 20, -1))  # still fifty checkpoints a page


def test_more_events_than_a_page_shows_are_announced(viewer_page: Client, thread: Thread) -> None:
    grow(thread, 2)
    for i in range(story.EVENTS_PER_PAGE + 5):
        storage.record_event(thread=thread, type="run.released", data={"worker": f"w{i}"})

    html = viewer_page.get(url(thread)).content.decode()

    assert len(event_types(html)) == story.EVENTS_PER_PAGE
    assert 'id="more-events"' in html


# --------------------------------------------------------------------------- the kind filter


def test_the_kind_filter_shows_one_kind_and_pages_through_it(viewer_page: Client, thread: Thread) -> None:
    grow(thread, 3)
    for i in range(60):
        storage.record_event(thread=thread, type="run.claimed", data={"worker": f"w{i}", "attempt": 1})
    storage.record_event(thread=thread, type="thread.resumed", data={"by": "ada", "reason": "go on"})

    first = viewer_page.get(url(thread, "kind=runs"))
    html = first.content.decode()
    assert first.status_code == 200
    assert timeline_seqs(html) == []  # no checkpoints
    assert event_types(html) == ["run.claimed"] * 50
    assert "w59" in html and "thread.resumed" not in html
    assert 'aria-current="true">Runs</a>' in html
    older = re.search(r'href="\?([^"]*before_event=\d+[^"]*)" rel="next"', html)
    assert older is not None

    second = viewer_page.get(url(thread, older.group(1).replace("&amp;", "&"))).content.decode()
    assert event_types(second) == ["run.claimed"] * 10
    assert "w9<" in second and "w10<" not in second and 'rel="next"' not in second
    newer = re.search(r'href="\?([^"]*after_event=\d+[^"]*)" rel="prev"', second)
    assert newer is not None
    back = viewer_page.get(url(thread, newer.group(1).replace("&amp;", "&"))).content.decode()
    assert event_types(back) == ["run.claimed"] * 50 and "w59" in back and "w9<" not in back

    changes = viewer_page.get(url(thread, "kind=changes")).content.decode()
    assert event_types(changes) == ["thread.resumed", "thread.created"]
    checkpoints_only = viewer_page.get(url(thread, "kind=checkpoints")).content.decode()
    assert event_types(checkpoints_only) == [] and timeline_seqs(checkpoints_only) == [3, 2, 1]


def test_a_kind_with_nothing_yet_says_so(viewer_page: Client, thread: Thread) -> None:
    grow(thread, 2)
    html = viewer_page.get(url(thread, "kind=approvals")).content.decode()
    assert "Nothing of this kind has happened on this thread yet" in html
    past = viewer_page.get(url(thread, "kind=approvals&before_event=1")).content.decode()
    assert "No events on this page" in past


@pytest.mark.parametrize(
    ("query", "problem"),
    [
        ("kind=stories", "kind: Select a valid choice. stories is not one of the available choices."),
        ("kind=runs&before_seq=4", "kind=runs lists events, which page with before_event or after_event"),
        ("before_event=4", "before_event and after_event page one kind of events: add kind=approvals"),
        ("kind=runs&before_event=4&after_event=2", "give before_event or after_event, not both."),
        ("kind=runs&before_event=-1", "before_event: Ensure this value is greater than or equal to 0."),
        ("kind=runs&after_event=x", "after_event: Enter a whole number."),
    ],
)
def test_a_bad_filter_is_a_400_naming_it(viewer_page: Client, thread: Thread, query: str, problem: str) -> None:
    grow(thread, 1)
    response = viewer_page.get(url(thread, query))
    assert response.status_code == 400
    assert problem in response.content.decode().replace("&#x27;", "'")


def test_the_story_index_is_partial_and_the_query_uses_it(viewer_page: Client, thread: Thread) -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT indexdef FROM pg_indexes WHERE indexname = 'event_story'")
        (definition,) = cursor.fetchone()
        assert "(thread_id, created_at, seq)" in definition
        assert "WHERE (NOT ((type)::text = 'checkpoint.created'::text))" in definition
        sql, params = story._story(thread.pk).filter(created_at__gte=timezone.now()).query.sql_with_params()
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("EXPLAIN " + sql, params)
        plan = " ".join(row[0] for row in cursor.fetchall())
    assert "event_story" in plan


# --------------------------------------------------------------------------- rewind from here


def test_every_row_rewinds_from_its_own_checkpoint_for_an_admin(admin_client: Client, thread: Thread) -> None:
    written = grow(thread, 3)
    request_approval(thread=thread, checkpoint=written[1], action="book_flight", args={})
    html = admin_client.get(url(thread)).content.decode()
    for checkpoint in written:
        row = re.search(rf'<tr data-seq="{checkpoint.seq}".*?</tr>', html, re.S).group(0)  # type: ignore[union-attr]
        assert f'<a class="rewind-link" href="/checkpoints/{checkpoint.pk}/fork/"' in row
    # An event rewinds from the checkpoint it happened at; one that names none offers nothing.
    asked = re.search(r'data-type="approval.requested".*?</tr>', html, re.S).group(0)  # type: ignore[union-attr]
    assert f'<a class="rewind-link" href="/checkpoints/{written[1].pk}/fork/"' in asked
    started = re.search(r'data-type="thread.created".*?</tr>', html, re.S).group(0)  # type: ignore[union-attr]
    assert "rewind-link" not in started
    # The link leads to the fork form of that checkpoint.
    form = admin_client.get(f"/checkpoints/{written[1].pk}/fork/")
    assert form.status_code == 200 and 'Rewind &amp; branch from <span class="seq">#2</span>' in form.content.decode()


@pytest.mark.parametrize("role", ["viewer", "reviewer"])
def test_no_rewind_is_offered_to_those_who_may_not_fork(thread: Thread, role: str) -> None:
    (first,) = grow(thread, 1)
    request_approval(thread=thread, checkpoint=first, action="book_flight", args={})
    client = Client()
    client.force_login(person("pat", role))
    html = client.get(url(thread)).content.decode()
    assert 'id="attention"' in html and 'data-type="approval.requested"' in html
    assert "rewind-link" not in html and "/fork/" not in html
    storage.append_checkpoint(thread=thread, parent=first, state={"n": 1}, status="failed", metadata={"error": "x"})
    html = client.get(url(thread)).content.decode()
    assert "rewind-link" not in html and "/fork/" not in html


def test_the_failure_banner_rewinds_from_the_failed_checkpoint(admin_client: Client, thread: Thread) -> None:
    (first,) = grow(thread, 1)
    failed = storage.append_checkpoint(thread=thread, parent=first, state={"n": 1}, status="failed",
                                     metadata={"error": "lock wait timeout"})  # fmt: skip
    html = admin_client.get(url(thread)).content.decode()
    banner = re.search(r'<section class="card attention failed".*?</section>', html, re.S).group(0)  # type: ignore[union-attr]
    assert f'<a class="button rewind-link" href="/checkpoints/{failed.pk}/fork/"' in banner


def test_the_waiting_banner_rewinds_from_the_checkpoint_that_asked(admin_client: Client, thread: Thread) -> None:
    _, second, _ = grow(thread, 3)
    request_approval(thread=thread, checkpoint=second, action="book_flight", args={})
    html = admin_client.get(url(thread)).content.decode()
    banner = re.search(r'<section class="card attention".*?</section>', html, re.S).group(0)  # type: ignore[union-attr]
    assert f'<a class="button rewind-link" href="/checkpoints/{second.pk}/fork/"' in banner


# --------------------------------------------------------------------------- pills and numbering


def test_pills_describe_the_checkpoint_not_the_thread(viewer_page: Client, thread: Thread) -> None:
    _, second = grow(thread, 2)
    asked = storage.append_checkpoint(thread=thread, parent=second, state={"n": 1}, status="waiting_for_approval")
    storage.append_checkpoint(thread=thread, parent=asked, state={"n": 2}, status="completed", label="booked")
    html = viewer_page.get(url(thread)).content.decode()

    pills = re.findall(r'<tr data-seq="(\d+)".*?<span class="badge status-(\w+)">([^<]+)</span>', html)
    assert pills == [("4", "completed", "Finished here"), ("3", "waiting_for_approval", "Asked for approval"),
                     ("2", "saved", "Saved"), ("1", "saved", "Saved")]  # fmt: skip
    timeline = html[html.index('id="timeline"') :]
    assert ">Running<" not in timeline


def test_steps_are_numbered_one_way(viewer_page: Client, thread: Thread) -> None:
    grow(thread, 21)  # the agent's step 20 is #21
    html = viewer_page.get(url(thread)).content.decode()
    assert '<th class="num">Step</th>' not in html
    assert re.search(r">#21 step 19<", html)  # the head fact names the checkpoint by its number
    assert "step 20" not in html and "Step 20" not in html


def test_the_thread_list_and_the_checkpoint_page_number_checkpoints_the_same_one_way(
    viewer_page: Client, thread: Thread
) -> None:
    grow(thread, 21)
    thread.refresh_from_db()
    listed = viewer_page.get("/").content.decode()
    checkpoint = viewer_page.get(f"/checkpoints/{thread.head_id}/").content.decode()

    assert '<th class="num">Step</th>' not in listed and ">#21 " in listed
    assert "Step <strong>" not in checkpoint and "#21" in checkpoint


# --------------------------------------------------------------------------- drawings folded below


def test_the_tree_and_chart_are_folded_below_the_timeline_and_drawn_only_when_asked(
    viewer_page: Client, thread: Thread
) -> None:
    grow(thread, 5)
    html = viewer_page.get(url(thread)).content.decode()
    assert html.index('id="timeline"') < html.index('<details class="card drawings" id="drawings"')
    assert '<svg id="branch-tree"' not in html and '<svg id="state-chart"' not in html
    assert 'href="?drawings=1#drawings" id="draw-link"' in html  # works without JavaScript

    drawn = viewer_page.get(url(thread, "drawings=1")).content.decode()
    assert '<details class="card drawings" id="drawings" open' in drawn
    assert '<svg id="branch-tree"' in drawn and '<svg id="state-chart"' in drawn


# --------------------------------------------------------------------------- unclaimed runs


@pytest.fixture
def stuck_run(thread: Thread) -> Run:
    (head,) = grow(thread, 1)
    run = runs.enqueue_run(thread=thread, checkpoint=head, reason=RunReason.MANUAL)
    age(run, 31)
    return run


WARNING = re.compile(r'No worker has claimed the queued run of the <span class="mono">(\S+)</span> agent</strong>')


def test_a_run_nobody_claims_is_flagged_on_the_thread_inbox_and_agents_pages(
    stuck_run: Run, thread: Thread, admin_client: Client, agent: Agent
) -> None:
    for page in (url(thread), "/inbox/", "/agents/"):
        body = admin_client.get(page).content.decode()
        assert WARNING.findall(body) == [agent.name], page
    inbox = admin_client.get("/inbox/").content.decode()
    assert f'(<a href="/threads/{thread.pk}/">its thread</a>)' in inbox


def test_a_fresh_or_claimed_run_is_not_flagged(stuck_run: Run, thread: Thread, admin_client: Client,
                                               agent: Agent, settings: Any) -> None:  # fmt: skip
    settings.QUICKSAVE_UNCLAIMED_RUN_SECONDS = 60
    assert "unclaimed-runs" not in admin_client.get(url(thread)).content.decode()  # 31 s < 60 s
    settings.QUICKSAVE_UNCLAIMED_RUN_SECONDS = 30
    assert "unclaimed-runs" in admin_client.get(url(thread)).content.decode()
    runs.claim_run(agents=[agent], worker="w1")
    for page in (url(thread), "/inbox/", "/agents/"):
        assert "unclaimed-runs" not in admin_client.get(page).content.decode(), page


def test_the_inbox_flags_only_runs_of_threads_the_reader_may_see(stuck_run: Run, other_agent: Agent) -> None:
    from checkpoints.models import Thread as ThreadModel

    other, _ = storage.create_thread(agent=other_agent, external_id="elsewhere")
    (head,) = grow(other, 1)
    age(runs.enqueue_run(thread=other, checkpoint=head, reason=RunReason.MANUAL), 40)
    everything = runs.unclaimed_runs()
    assert sorted(item.agent for item in everything) == sorted([stuck_run.agent.name, other_agent.name])
    scoped = runs.unclaimed_runs(threads=ThreadModel.objects.filter(pk=stuck_run.thread_id))
    assert [(item.agent, item.runs, item.thread_id) for item in scoped] == [
        (stuck_run.agent.name, 1, stuck_run.thread_id)
    ]


def test_events_of_other_threads_never_show(viewer_page: Client, thread: Thread, agent: Agent) -> None:
    grow(thread, 1)
    other, _ = storage.create_thread(agent=agent, external_id="trip-2")
    storage.record_event(thread=other, type="thread.cancelled", data={"by": "someone", "reason": "elsewhere"})
    html = viewer_page.get(url(thread)).content.decode()
    assert "elsewhere" not in html
    assert Event.objects.filter(thread=other, type="thread.cancelled").exists()
    assert Checkpoint.objects.filter(thread=thread).count() == 1
