"""QuicksaveSessionService: ADK sessions stored as Quicksave threads.

A session is a thread of the Quicksave agent named by the ADK app (external id
`["<user_id>", "<session_id>"]`, metadata `{"framework": "adk", "adk": {...}}`). Each appended
event is a checkpoint whose state is `{"state": <session-scoped state>, "event": <the event>}`,
written as a patch that replaces `/event` and adds the state delta: a delta of about one event,
and an event that reads back from its own row. So `get_session(num_recent_events=n)` is one
statement reading n rows newest first (integrations.adk.reads) and the head's small state,
whatever the session's length.

`app:` and `user:` state is shared as ADK's own services share it: each scope is a thread of its
own (external ids `adk:app-state`, `adk:user-state:<user_id>`) whose head state holds the
unprefixed keys; `temp:` state is never stored. A session whose caller holds an older copy than
the stored one gets StaleSessionError on append, as from ADK's DatabaseSessionService. An event
that asks for tool confirmations files the approval of the first in the same transaction (the
others follow as each is decided: integrations.adk.confirmations).
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote
from uuid import UUID

from channels.db import database_sync_to_async
from django.db import transaction
from django.db.models import QuerySet
from google.adk.errors import StaleSessionError
from google.adk.errors.already_exists_error import AlreadyExistsError
from google.adk.errors.session_not_found_error import SessionNotFoundError
from google.adk.events.event import Event
from google.adk.sessions.base_session_service import BaseSessionService, GetSessionConfig, ListSessionsResponse
from google.adk.sessions.session import Session
from google.adk.sessions.state import State

from checkpoints import storage
from checkpoints.models import Checkpoint, CheckpointStatus, Thread, ThreadStatus
from checkpoints.storage import NotFound, StaleParent
from integrations.adk import confirmations
from integrations.adk.forks import FRAMEWORK, last_event
from integrations.adk.reads import read_session
from quicksave_agents.fencing import Fence
from quicksave_agents.keys import get_or_create_agent
from quicksave_agents.models import Agent

APP_SCOPE = "adk:app-state"
USER_SCOPE = "adk:user-state:"
LABEL_CHARS = 200
HEAD_FIELDS = ("id", "thread_id", "branch_id", "seq", "step", "metadata", "created_at")


@dataclass(frozen=True)
class Head:
    """What an append needs of a session's thread: its newest checkpoint, as a service last saw it."""

    thread: Thread
    checkpoint_id: UUID
    step: int
    event_id: str | None
    ts: float
    waiting: bool

    @classmethod
    def of(cls, thread: Thread, head: Checkpoint) -> Head:
        return cls(thread=thread, checkpoint_id=head.pk, step=head.step or 0, event_id=last_event(head.metadata),
                   ts=updated_at(head), waiting=thread.status == ThreadStatus.WAITING_FOR_APPROVAL)  # fmt: skip


def session_key(user_id: str, session_id: str) -> str:
    """The thread's external id, which the dashboard shows as the thread's name: `user/session`,
    each percent-encoded (a `/` in either becomes %2F), so it reads plainly for plain ids and is
    unambiguous whatever they contain."""
    key = f"{quote(user_id, safe='')}/{quote(session_id, safe='')}"
    if len(key) > 255:
        raise ValueError("The user id and session id together are too long for a Quicksave thread (255 characters).")
    return key


class QuicksaveSessionService(BaseSessionService):
    """ADK's BaseSessionService on Quicksave threads (see the module docstring).

    The worker passes its run's `fence` and `lease_held`: every write of a resumed invocation
    carries the fence, and stops (LeaseLost) once another attempt holds the run.
    """

    def __init__(self, *, fence: Fence | None = None, lease_held: Callable[[], bool] | None = None) -> None:
        self.fence = fence
        self.lease_held = lease_held or (lambda: True)
        self._heads: dict[tuple[str, str, str], Head] = {}

    # ------------------------------------------------------------------ the interface

    async def create_session(
        self, *, app_name: str, user_id: str, state: dict[str, Any] | None = None, session_id: str | None = None
    ) -> Session:
        return await database_sync_to_async(self.create_session_sync)(
            app_name=app_name, user_id=user_id, state=state, session_id=session_id
        )

    async def get_session(
        self, *, app_name: str, user_id: str, session_id: str, config: GetSessionConfig | None = None
    ) -> Session | None:
        return await database_sync_to_async(self.get_session_sync)(
            app_name=app_name, user_id=user_id, session_id=session_id, config=config
        )

    async def list_sessions(self, *, app_name: str, user_id: str | None = None) -> ListSessionsResponse:
        return await database_sync_to_async(self.list_sessions_sync)(app_name=app_name, user_id=user_id)

    async def delete_session(self, *, app_name: str, user_id: str, session_id: str) -> None:
        await database_sync_to_async(self.delete_session_sync)(app_name=app_name, user_id=user_id,
                                                               session_id=session_id)  # fmt: skip

    async def get_user_state(self, *, app_name: str, user_id: str) -> dict[str, Any]:
        return await database_sync_to_async(self._scope_state)(app_name, USER_SCOPE + user_id)

    async def append_event(self, session: Session, event: Event) -> Event:
        if event.partial:
            return event
        stored = await database_sync_to_async(self.store_event)(session, event)
        if not stored:
            return event  # the same event delivered again
        # ADK's own bookkeeping: temp: state into the live session, the rest of the delta too.
        await super().append_event(session=session, event=event)
        session.last_update_time = event.timestamp
        return event

    # ------------------------------------------------------------------ sync bodies

    def create_session_sync(
        self, *, app_name: str, user_id: str, state: dict[str, Any] | None = None, session_id: str | None = None
    ) -> Session:
        session_id = (session_id or "").strip() or str(uuid.uuid4())
        app_delta, user_delta, session_state = split(state or {})
        agent = get_or_create_agent(name=app_name, version=FRAMEWORK)
        now = time.time()
        with transaction.atomic():
            thread, created = storage.create_thread(
                agent=agent, external_id=session_key(user_id, session_id),
                metadata={"framework": FRAMEWORK, "adk": {"app_name": app_name, "user_id": user_id,
                                                          "session_id": session_id}},
            )  # fmt: skip
            if not created:
                raise AlreadyExistsError(f"Session with id {session_id} already exists.")
            storage.append_checkpoint(thread=thread, parent=None, state={"state": session_state, "event": None}, step=0,
                                    label="session created", metadata={"ts": now}, fence=self.fence)  # fmt: skip
            app_state = self._update_scope(agent, APP_SCOPE, app_delta)
            user_state = self._update_scope(agent, USER_SCOPE + user_id, user_delta)
        return Session(id=session_id, app_name=app_name, user_id=user_id, last_update_time=now,
                       state=merged(app_state, user_state, session_state))  # fmt: skip

    def get_session_sync(
        self, *, app_name: str, user_id: str, session_id: str, config: GetSessionConfig | None = None
    ) -> Session | None:
        session_id = session_id.strip() if session_id else session_id  # as ADK's own services normalise it
        try:
            key = session_key(user_id, session_id)
        except ValueError:
            return None
        limit = config.num_recent_events if config else None
        found = read_session(app_name=app_name, key=key, app_scope=APP_SCOPE, user_scope=USER_SCOPE + user_id,
                             limit=limit, after=config.after_timestamp if config else None)  # fmt: skip
        if found is None:
            return None
        thread = Thread(id=found.thread_id, agent_id=found.agent_id, status=found.status)
        self._heads[(app_name, user_id, session_id)] = Head(
            thread=thread, checkpoint_id=found.head_id, step=found.head_step,
            event_id=last_event(found.head_metadata), ts=found.updated_at,
            waiting=found.status == ThreadStatus.WAITING_FOR_APPROVAL,
        )  # fmt: skip
        app_state, user_state = (session_state(head, key=None) if head else {}
                                 for head in (found.app_head, found.user_head))  # fmt: skip
        return Session(id=session_id, app_name=app_name, user_id=user_id, events=found.events,
                       last_update_time=found.updated_at,
                       state=merged(app_state, user_state, session_state(found.head_id)))  # fmt: skip

    def list_sessions_sync(self, *, app_name: str, user_id: str | None = None) -> ListSessionsResponse:
        threads = Thread.objects.filter(agent__name=app_name, metadata__framework=FRAMEWORK,
                                        metadata__adk__has_key="session_id", head__isnull=False)  # fmt: skip
        if user_id is not None:
            threads = threads.filter(metadata__adk__user_id=user_id)
        rows = threads.values_list("metadata", "head_id", "head__metadata__ts")
        app_state = self._scope_state(app_name, APP_SCOPE)
        user_states: dict[str, dict[str, Any]] = {}
        sessions = []
        for metadata, head_id, ts in rows:
            info = metadata["adk"]
            owner = info["user_id"]
            if owner not in user_states:
                user_states[owner] = self._scope_state(app_name, USER_SCOPE + owner)
            sessions.append(Session(id=info["session_id"], app_name=app_name, user_id=owner,
                                    last_update_time=float(ts) if ts is not None else 0.0,
                                    state=merged(app_state, user_states[owner], session_state(head_id))))  # fmt: skip
        sessions.sort(key=lambda s: (s.last_update_time, s.user_id, s.id))
        return ListSessionsResponse(sessions=sessions)

    def delete_session_sync(self, *, app_name: str, user_id: str, session_id: str) -> None:
        thread = find_thread(app_name, user_id, session_id)
        self._heads.pop((app_name, user_id, session_id.strip() if session_id else session_id), None)
        if thread is not None:
            storage.delete_thread(thread)

    def store_event(self, session: Session, event: Event) -> bool:
        """Write `event` as the session's next checkpoint; False when it is the head already.

        An event is the head already when the head holds its id and the caller's copy of the session
        ends with an equal event: the same event delivered again (the same object, or an equal copy
        from a caller retrying its append), which is written once, as ADK's InMemorySessionService
        does. A different event that only shares the id is written. The head this service last
        wrote or read is tried first, so an append is one statement in autocommit; the storage
        engine refuses it if the head moved, and the head is then read again.
        """
        if self.fence is not None and not self.lease_held():
            raise self.fence.lost(thread_id=self._head(session, fresh=False).thread.pk)
        for fresh in (False, True):
            head = self._head(session, fresh=fresh)
            if head.event_id == event.id and session.events and session.events[-1] == event:
                return False
            if (session.events and head.event_id != session.events[-1].id) or (
                not session.events and head.ts > session.last_update_time
            ):
                if not fresh:
                    continue
                raise StaleSessionError(
                    f"Session {session.id} was changed since this copy was read (its last event is "
                    f"{head.event_id}); read it again with get_session."
                )
            try:
                self._append(session, event, head)
            except (StaleParent, NotFound):
                if not fresh:
                    continue
                raise StaleSessionError(f"Session {session.id} was changed by another writer; read it again.") from None
            return True
        raise AssertionError("unreachable: the second pass raises or returns")

    def _append(self, session: Session, event: Event, head: Head) -> None:
        delta = event.actions.state_delta if event.actions else {}
        app_delta, user_delta, session_delta = split(delta)
        body = event.model_dump(mode="json", exclude_none=True)
        if body.get("actions", {}).get("state_delta"):
            body["actions"]["state_delta"] = {k: v for k, v in delta.items() if not k.startswith(State.TEMP_PREFIX)}
        patch: list[dict[str, Any]] = [{"op": "replace", "path": "/event", "value": body}]
        for key, value in session_delta.items():
            patch.append({"op": "add", "path": f"/state/{pointer(key)}", "value": value})
        asks = confirmations.requests_in(event)
        # Alone, the append is one statement in autocommit; with shared state or an approval to
        # file, they commit together.
        with transaction.atomic() if asks or app_delta or user_delta else contextlib.nullcontext():
            checkpoint = storage.append_checkpoint(
                thread=head.thread, parent=head.checkpoint_id, patch=patch, step=head.step + 1,
                label=label_of(event),
                # The events after a confirmation's, in its invocation, leave the thread waiting.
                status=CheckpointStatus.WAITING_FOR_APPROVAL if asks or head.waiting else CheckpointStatus.RUNNING,
                # In clear, for the reads that filter and order on them; the event itself is sealed.
                metadata={"adk_event": event.id, "ts": event.timestamp},
                fence=self.fence,
            )  # fmt: skip
            if app_delta or user_delta:
                agent = Agent.objects.get(pk=head.thread.agent_id)
                self._update_scope(agent, APP_SCOPE, app_delta)
                self._update_scope(agent, USER_SCOPE + session.user_id, user_delta)
            filed = confirmations.file_next(thread=head.thread, checkpoint=checkpoint, requests=asks,
                                            fence=self.fence) if asks else None  # fmt: skip
        self._heads[(session.app_name, session.user_id, session.id)] = Head(
            thread=head.thread, checkpoint_id=checkpoint.pk, step=head.step + 1, event_id=event.id,
            ts=event.timestamp, waiting=head.waiting or filed is not None,
        )  # fmt: skip

    def thread_of(self, session: Session) -> Thread:
        """The session's thread (as this service last saw it: no query after a read or a write)."""
        return self._head(session, fresh=False).thread

    def _head(self, session: Session, *, fresh: bool) -> Head:
        """The session's head as this service last saw it, or (`fresh`) as stored."""
        key = (session.app_name, session.user_id, session.id)
        known = self._heads.get(key)
        if known is not None and not fresh:
            return known
        thread = find_thread(session.app_name, session.user_id, session.id, with_head=True)
        if thread is None or thread.head is None:
            self._heads.pop(key, None)
            raise SessionNotFoundError(f"Session {session.id} not found.")
        self._heads[key] = head = Head.of(thread, thread.head)
        return head

    # ------------------------------------------------------------------ app and user state

    def _scope_state(self, app_name: str, key: str) -> dict[str, Any]:
        return self._scope_states(app_name, key)[0]

    def _scope_states(self, app_name: str, *keys: str) -> list[dict[str, Any]]:
        """The states of the scopes named by `keys` (one query for their heads), {} for a scope never written."""
        heads = dict(Thread.objects.filter(agent__name=app_name, external_id__in=keys, head__isnull=False)
                     .values_list("external_id", "head_id"))  # fmt: skip
        return [session_state(heads[key], key=None) if key in heads else {} for key in keys]

    def _update_scope(self, agent: Agent, key: str, delta: dict[str, Any]) -> dict[str, Any]:
        """Merge `delta` into a scope's state (a checkpoint when it changes anything); the new state."""
        if not delta:
            return self._scope_state(agent.name, key)
        thread, _ = storage.create_thread(agent=agent, external_id=key,
                                        metadata={"framework": FRAMEWORK, "adk": {"scope": key}})  # fmt: skip
        while True:
            head, state = storage.latest_state(thread=thread)
            if all(name in state and state[name] == value for name, value in delta.items()):
                return state
            try:
                with transaction.atomic():
                    storage.append_checkpoint(thread=thread, parent=head, state={**state, **delta}, label="state",
                                            fence=self.fence)  # fmt: skip
                return {**state, **delta}
            except StaleParent:
                continue  # another session changed this scope meanwhile: merge into theirs


# --------------------------------------------------------------------------- reading


def find_thread(app_name: str, user_id: str, session_id: str, *, with_head: bool = False) -> Thread | None:
    """The session's thread (with its head checkpoint's clear fields when `with_head`), or None."""
    session_id = session_id.strip() if session_id else session_id
    try:
        key = session_key(user_id, session_id)
    except ValueError:
        return None
    threads = Thread.objects.filter(agent__name=app_name, external_id=key)
    return (with_heads(threads) if with_head else threads.only("id", "agent_id", "head_id", "status")).first()


def with_heads(threads: QuerySet[Thread]) -> QuerySet[Thread]:
    """`threads` with their head checkpoints' clear fields, in the same query."""
    return threads.select_related("head").only(
        "id", "agent_id", "external_id", "head_id", "status", *(f"head__{name}" for name in HEAD_FIELDS)
    )


def session_state(checkpoint_id: Any, *, key: str | None = "state") -> dict[str, Any]:
    """The state at a checkpoint: a session's (under `key`) or a scope's (the whole state)."""
    state = storage.load_node(checkpoint_id, hot=True).state
    return dict((state.get(key) or {}) if key else state)


def updated_at(head: Checkpoint) -> float:
    ts = head.metadata.get("ts")
    return float(ts) if isinstance(ts, (int, float)) else head.created_at.timestamp()


# --------------------------------------------------------------------------- state scopes


def split(delta: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(app, user, session) parts of a state or delta, prefixes stripped from app and user keys; temp: dropped."""
    app, user, session = {}, {}, {}
    for key, value in delta.items():
        if key.startswith(State.APP_PREFIX):
            app[key.removeprefix(State.APP_PREFIX)] = value
        elif key.startswith(State.USER_PREFIX):
            user[key.removeprefix(State.USER_PREFIX)] = value
        elif not key.startswith(State.TEMP_PREFIX):
            session[key] = value
    return app, user, session


def merged(app: dict[str, Any], user: dict[str, Any], session: dict[str, Any]) -> dict[str, Any]:
    state = dict(session)
    state.update({State.APP_PREFIX + key: value for key, value in app.items()})
    state.update({State.USER_PREFIX + key: value for key, value in user.items()})
    return state


def pointer(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def label_of(event: Event) -> str:
    """`<author>: <what>` for the timeline, naming tools but never quoting text: a label is stored
    in clear, the event's content only sealed."""
    what = "event"
    for part in (event.content.parts or []) if event.content else []:
        if part.function_call:
            what = f"calls {part.function_call.name}"
            break
        if part.function_response:
            what = f"{part.function_response.name} returned"
            break
        if part.text:
            what = "message"
    label = f"{event.author}: {what}"
    return label if len(label) <= LABEL_CHARS else label[: LABEL_CHARS - 1] + "…"
