"""QuicksaveSessionService keeps ADK sessions as Quicksave threads: each event a checkpoint, the
session's state the checkpoints' state, app: and user: state shared, temp: never stored."""

from __future__ import annotations

from typing import Any
from uuid import uuid4

import pytest
from channels.db import database_sync_to_async
from google.adk.errors import StaleSessionError
from google.adk.errors.already_exists_error import AlreadyExistsError
from google.adk.errors.session_not_found_error import SessionNotFoundError
from google.adk.events.event import Event
from google.adk.events.event_actions import EventActions
from google.adk.sessions.base_session_service import GetSessionConfig
from google.adk.sessions.session import Session
from google.genai import types

from checkpoints.models import Checkpoint, Thread
from integrations.adk.sessions import QuicksaveSessionService, find_thread, session_key

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


def said(text: str, *, author: str = "user", delta: dict[str, Any] | None = None, at: float | None = None) -> Event:
    content = types.Content(role="user" if author == "user" else "model", parts=[types.Part(text=text)])
    event = Event(invocation_id="inv", author=author, actions=EventActions(state_delta=delta or {}), content=content)
    if at is not None:
        event.timestamp = at
    return event


def texts(session: Session) -> list[str]:
    return [str(event.content.parts[0].text) for event in session.events if event.content and event.content.parts]


@pytest.fixture
def app() -> str:
    return f"app-{uuid4().hex[:8]}"


async def test_events_come_back_in_order_with_the_state_their_deltas_left(app: str) -> None:
    service = QuicksaveSessionService()
    session = await service.create_session(app_name=app, user_id="ana", state={"mood": "calm"})
    for n in range(3):
        await service.append_event(session, said(f"turn {n}", delta={"turns": n + 1}))

    got = await service.get_session(app_name=app, user_id="ana", session_id=session.id)

    assert got is not None
    assert texts(got) == ["turn 0", "turn 1", "turn 2"]
    assert got.events == session.events
    assert got.state == {"mood": "calm", "turns": 3}
    assert got.last_update_time == session.events[-1].timestamp


async def test_each_event_is_a_checkpoint_of_the_sessions_thread_which_names_its_framework(app: str) -> None:
    service = QuicksaveSessionService()
    session = await service.create_session(app_name=app, user_id="ana", session_id="trip")
    await service.append_event(session, said("Rome, please"))
    await service.append_event(session, said("Booked.", author="concierge"))

    def read() -> tuple[Thread, list[str]]:
        found = find_thread(app, "ana", "trip")
        assert found is not None
        thread = Thread.objects.get(pk=found.pk)
        return thread, list(Checkpoint.objects.filter(thread=thread).order_by("seq").values_list("label", flat=True))

    thread, labels = await database_sync_to_async(read)()

    assert thread.metadata["framework"] == "adk"
    assert thread.metadata["adk"] == {"app_name": app, "user_id": "ana", "session_id": "trip"}
    assert labels == ["session created", "user: message", "concierge: message"]


async def test_app_and_user_state_are_shared_across_sessions_and_temp_state_is_never_stored(app: str) -> None:
    service = QuicksaveSessionService()
    first = await service.create_session(app_name=app, user_id="ana", state={"app:theme": "dark", "user:lang": "pt"})
    await service.append_event(first, said("hi", delta={"app:motd": "hello", "user:city": "Lisbon", "temp:scratch": 1,
                                                        "draft": "x"}))  # fmt: skip

    assert first.state["temp:scratch"] == 1  # the live session sees it during the invocation
    same_user = await service.create_session(app_name=app, user_id="ana")
    other_user = await service.create_session(app_name=app, user_id="rui")
    again = await service.get_session(app_name=app, user_id="ana", session_id=first.id)

    assert same_user.state == {"app:theme": "dark", "app:motd": "hello", "user:lang": "pt", "user:city": "Lisbon"}
    assert other_user.state == {"app:theme": "dark", "app:motd": "hello"}
    assert again is not None and "temp:scratch" not in again.state and again.state["draft"] == "x"
    assert "temp:scratch" not in (again.events[-1].actions.state_delta or {})
    assert await service.get_user_state(app_name=app, user_id="ana") == {"lang": "pt", "city": "Lisbon"}


async def test_recent_events_and_events_after_a_time_are_the_newest_ones_in_order(app: str) -> None:
    service = QuicksaveSessionService()
    session = await service.create_session(app_name=app, user_id="ana")
    for n in range(6):
        await service.append_event(session, said(f"turn {n}", at=1000.0 + n))

    recent = await service.get_session(app_name=app, user_id="ana", session_id=session.id,
                                       config=GetSessionConfig(num_recent_events=2))  # fmt: skip
    after = await service.get_session(app_name=app, user_id="ana", session_id=session.id,
                                      config=GetSessionConfig(after_timestamp=1003.0))  # fmt: skip
    none = await service.get_session(app_name=app, user_id="ana", session_id=session.id,
                                     config=GetSessionConfig(num_recent_events=0))  # fmt: skip

    assert recent is not None and texts(recent) == ["turn 4", "turn 5"]
    assert after is not None and texts(after) == ["turn 3", "turn 4", "turn 5"]
    assert none is not None and none.events == [] and none.last_update_time == 1005.0


async def test_a_copy_read_before_another_write_cannot_append(app: str) -> None:
    service = QuicksaveSessionService()
    session = await service.create_session(app_name=app, user_id="ana")
    stale = await service.get_session(app_name=app, user_id="ana", session_id=session.id)
    await service.append_event(session, said("first"))

    assert stale is not None
    with pytest.raises(StaleSessionError):
        await service.append_event(stale, said("second, from an old copy"))
    got = await service.get_session(app_name=app, user_id="ana", session_id=session.id)
    assert got is not None and texts(got) == ["first"]


async def test_an_event_delivered_again_as_an_equal_copy_is_stored_once_but_another_event_with_its_id_is_kept(
    app: str,
) -> None:
    """A caller that retries an append (the same event, or an equal copy of it) writes it once, as
    ADK's InMemorySessionService does; a different event that only shares the id is its own event."""
    service = QuicksaveSessionService()
    session = await service.create_session(app_name=app, user_id="ana")
    sent = said("once", delta={"turns": 1})
    await service.append_event(session, sent)
    await service.append_event(session, sent)
    await service.append_event(session, sent.model_copy(deep=True))
    reread = await service.get_session(app_name=app, user_id="ana", session_id=session.id)
    assert reread is not None
    await service.append_event(reread, sent.model_copy(deep=True))  # a retry from a copy read back
    other = said("same id, another event")
    other.id = sent.id
    await service.append_event(session, other)

    got = await service.get_session(app_name=app, user_id="ana", session_id=session.id)
    assert got is not None
    assert texts(got) == ["once", "same id, another event"]
    assert texts(session) == ["once", "same id, another event"]
    assert reread.events == [sent]


async def test_sessions_are_listed_by_last_update_and_deleted_with_their_thread(app: str) -> None:
    service = QuicksaveSessionService()
    older = await service.create_session(app_name=app, user_id="ana", session_id="a")
    newer = await service.create_session(app_name=app, user_id="ana", session_id="b")
    await service.create_session(app_name=app, user_id="rui", session_id="c")
    await service.append_event(older, said("back again"))

    mine = await service.list_sessions(app_name=app, user_id="ana")
    everyone = await service.list_sessions(app_name=app)
    await service.delete_session(app_name=app, user_id="ana", session_id=newer.id)

    assert [s.id for s in mine.sessions] == ["b", "a"]
    assert all(s.events == [] for s in mine.sessions)
    assert sorted(s.id for s in everyone.sessions) == ["a", "b", "c"]
    assert await service.get_session(app_name=app, user_id="ana", session_id="b") is None
    with pytest.raises(AlreadyExistsError):
        await service.create_session(app_name=app, user_id="ana", session_id="a")
    with pytest.raises(SessionNotFoundError):
        await service.append_event(newer, said("into a deleted session"))


async def test_two_services_on_one_session_refuse_the_older_copy_and_take_a_fresh_one(app: str) -> None:
    mine, theirs = QuicksaveSessionService(), QuicksaveSessionService()
    session = await mine.create_session(app_name=app, user_id="ana")
    their_copy = await theirs.get_session(app_name=app, user_id="ana", session_id=session.id)
    await mine.append_event(session, said("from mine"))

    assert their_copy is not None
    with pytest.raises(StaleSessionError):
        await theirs.append_event(their_copy, said("from an old copy"))
    fresh = await theirs.get_session(app_name=app, user_id="ana", session_id=session.id)
    assert fresh is not None
    await theirs.append_event(fresh, said("from theirs"))
    with pytest.raises(StaleSessionError):  # mine is the older copy now
        await mine.append_event(session, said("mine again, behind theirs"))

    got = await mine.get_session(app_name=app, user_id="ana", session_id=session.id)
    assert got is not None and texts(got) == ["from mine", "from theirs"]


async def test_a_dashboard_fork_is_where_the_session_goes_on_with_the_edited_state(app: str) -> None:
    service = QuicksaveSessionService()
    session = await service.create_session(app_name=app, user_id="ana", state={"mood": "calm"})
    for n in range(3):
        await service.append_event(session, said(f"turn {n}"))

    def fork_after_the_first_turn() -> None:
        from checkpoints import forks
        from tests.conftest import person

        found = find_thread(app, "ana", session.id)
        assert found is not None
        first = Checkpoint.objects.get(thread_id=found.pk, seq=2)
        forks.fork(checkpoint=first, user=person("ada", "admin"), reason="try it bolder",
                   patch=[{"op": "replace", "path": "/state/mood", "value": "bold"}], resume=True)  # fmt: skip

    await database_sync_to_async(fork_after_the_first_turn)()
    forked = await service.get_session(app_name=app, user_id="ana", session_id=session.id)
    assert forked is not None and texts(forked) == ["turn 0"] and forked.state == {"mood": "bold"}

    await service.append_event(forked, said("turn 1, bolder"))
    recent = await QuicksaveSessionService().get_session(app_name=app, user_id="ana", session_id=session.id,
                                                         config=GetSessionConfig(num_recent_events=5))  # fmt: skip
    assert recent is not None and texts(recent) == ["turn 0", "turn 1, bolder"]
    with pytest.raises(StaleSessionError):  # the copy from before the fork is on the branch left behind
        await service.append_event(session, said("turn 3, on the old branch"))


async def test_a_worker_attempt_that_lost_its_run_writes_nothing(app: str) -> None:
    from django.utils import timezone

    from quicksave_agents.fencing import Fence, LeaseLost
    from quicksave_agents.models import Agent, Run, RunReason
    from quicksave_agents.runs import claim_run, enqueue_run

    service = QuicksaveSessionService()
    session = await service.create_session(app_name=app, user_id="ana")

    def claimed_twice() -> Fence:
        found = find_thread(app, "ana", session.id)
        assert found is not None
        thread = Thread.objects.select_related("head").get(pk=found.pk)
        assert thread.head is not None
        run = enqueue_run(thread=thread, checkpoint=thread.head, reason=RunReason.MANUAL)
        agents = [Agent.objects.get(pk=thread.agent_id)]
        claim_run(agents=agents, worker="first", lease_seconds=1)
        Run.objects.filter(pk=run.pk).update(lease_expires_at=timezone.now())  # the first worker's lease ran out
        assert claim_run(agents=agents, worker="second") is not None
        return Fence(run.pk, 1)

    first_attempt = await database_sync_to_async(claimed_twice)()
    with pytest.raises(LeaseLost):
        await QuicksaveSessionService(fence=first_attempt).append_event(session, said("from the first attempt"))
    got = await service.get_session(app_name=app, user_id="ana", session_id=session.id)
    assert got is not None and got.events == []


async def test_a_sessions_thread_is_named_user_slash_session_and_no_two_pairs_share_a_name() -> None:
    assert session_key("ana", "trip-7") == "ana/trip-7"
    assert session_key("ana/b", "c") != session_key("ana", "b/c")
    assert session_key("ana", "b/c") == "ana/b%2Fc"
