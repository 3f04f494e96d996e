"""`QuicksaveSession`: the OpenAI Agents SDK's `Session` protocol on Quicksave threads.

One session is one Quicksave thread (`external_id` = the session id) under a Quicksave agent.
Its state is `{"items": [...]}`, the session's input items in order; every `add_items` is one
checkpoint whose delta is `add /items/-` per new item, so a write costs O(new items), not
O(conversation), and each turn shows on the timeline and in diffs. `pop_item` removes the last
item and `clear_session` empties the list, each as a checkpoint too (history is never rewritten).
Each checkpoint's `step` counts the user turns of the conversation after it (0 for the empty
session it starts with), so a branch point is found without reading any state, and the timeline
and the thread list show the turn. A checkpoint carries this integration's metadata
(`openai_agents`) only when it has something to say: the call a paused run waits on, a failed
run's error (counts in every checkpoint's metadata took some 70 bytes a row, two rows a turn).
Checkpoints written before counted items and turns there (`openai_agents.items`, `.turns`) and
left `step` empty; they read as they did.

A session writes to one branch: the thread's active branch when opened (the one the dashboard
shows, which a dashboard fork moves), or the one `create_branch_from_turn` opens. Writes go
after the head this session last read or wrote; when another writer moved the branch on, the
session appends after theirs (a conversation is append-only). A run paused for approval keeps
the SDK's `RunState` beside the items (`run_state`, see integrations.openai_agents.approvals);
the next write after the run resumes drops it.
"""

from __future__ import annotations

import copy
import uuid
from typing import TYPE_CHECKING, Any
from uuid import UUID

from agents.memory.session_settings import SessionSettings, resolve_session_limit
from channels.db import database_sync_to_async
from django.db import connection, transaction

from checkpoints import storage
from checkpoints.models import Branch, Checkpoint, CheckpointStatus, Thread
from checkpoints.storage import StaleParent
from quicksave_agents.fencing import Fence
from quicksave_agents.keys import get_or_create_agent

if TYPE_CHECKING:
    from agents.items import TResponseInputItem

FRAMEWORK = "openai-agents"
DEFAULT_AGENT = "openai-agents"
# Checkpoint metadata key of this integration (the paused call of a waiting checkpoint, a run's error;
# on checkpoints written before the turn count moved to `step`, also the counts).
META = "openai_agents"
# The state key of a paused run's RunState (integrations.openai_agents.approvals writes it).
RUN_STATE = "run_state"
HEAD_SQL = """
SELECT id, coalesce(step, (metadata -> 'openai_agents' ->> 'turns')::int),
       coalesce((metadata -> 'openai_agents' ->> 'paused')::boolean, false)
FROM checkpoints_checkpoint
WHERE thread_id = %(thread)s AND branch_id = %(branch)s ORDER BY seq DESC LIMIT 1
"""
# A racing writer moved the branch on this many times in a row: give up rather than spin.
STALE_RETRIES = 5


class QuicksaveSession:
    """Conversation memory for `Runner.run(agent, input, session=QuicksaveSession("trip-7"))`.

    `agent` names the Quicksave agent that owns the thread (the name a worker resumes it under,
    see integrations.openai_agents.runner); `session_settings.limit` (or `get_items(limit=...)`)
    bounds what a run reads back, as the SDK's own sessions do.
    """

    session_settings: SessionSettings | None

    def __init__(
        self,
        session_id: str,
        *,
        agent: str = DEFAULT_AGENT,
        branch: str | None = None,
        session_settings: SessionSettings | None = None,
        fence: Fence | None = None,
    ) -> None:
        self.session_id = session_id
        self.agent = agent
        self.branch = branch
        self.session_settings = session_settings
        self.fence = fence
        self._thread: Thread | None = None
        self._branch_id: int | None = None
        self._fork_point: UUID | None = None
        # The head this session last read or wrote, with its count of user turns.
        self._head: tuple[UUID, int] | None = None
        self._paused = False

    @classmethod
    def for_checkpoint(cls, checkpoint: Checkpoint, *, fence: Fence | None = None) -> QuicksaveSession:
        """The session of `checkpoint`'s thread, writing after it on its branch (the worker's view)."""
        thread = Thread.objects.select_related("agent").get(pk=checkpoint.thread_id)
        session = cls(thread.external_id or str(thread.pk), agent=thread.agent.name, fence=fence,
                      branch=storage.get_branch_name(checkpoint.branch_id))  # fmt: skip
        session._thread = thread
        session._remember(checkpoint)
        return session

    # --- the SDK's Session protocol -------------------------------------------------------------

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        return await database_sync_to_async(self.read_items)(resolve_session_limit(limit, self.session_settings))

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        if items:
            await database_sync_to_async(self.append_items)(list(items))

    async def pop_item(self) -> TResponseInputItem | None:
        return await database_sync_to_async(self.pop)()

    async def clear_session(self) -> None:
        await database_sync_to_async(self.clear)()

    # --- branching ------------------------------------------------------------------------------

    async def create_branch_from_turn(self, turn: int, name: str | None = None) -> QuicksaveSession:
        """A session on a new branch holding this conversation as it was before user turn `turn`
        (1 for the first user message): run the agent on it to ask that turn differently. The
        branch shows in the dashboard's branch tree like a fork."""
        return await database_sync_to_async(self.branch_from_turn)(turn, name)

    def branch_from_turn(self, turn: int, name: str | None = None) -> QuicksaveSession:
        if turn < 1:
            raise ValueError("Turns count from 1 (the first user message).")
        self._resolve(refresh=True)
        if self._head is None or turn > self._head[1]:
            raise ValueError(f"Session {self.session_id!r} has no turn {turn}.")
        head = self._head[0]
        # The newest checkpoint of this line that had fewer than `turn` user turns.
        at = next((checkpoint for checkpoint in _line(self.thread, head) if _turns(checkpoint) < turn), None)
        if at is None:
            raise ValueError(f"Session {self.session_id!r} has no turn {turn}.")
        name = name or f"turn-{turn}-{uuid.uuid4().hex[:8]}"
        storage.start_branch(thread=self.thread, at=at, name=name)
        branched = QuicksaveSession(self.session_id, agent=self.agent, branch=name,
                                    session_settings=self.session_settings, fence=self.fence)  # fmt: skip
        branched._thread = self.thread
        branched._remember(at)
        return branched

    # --- synchronous implementations (callable from the worker and management commands) ---------

    @property
    def thread(self) -> Thread:
        if self._thread is None:
            record = get_or_create_agent(name=self.agent)
            metadata = {"framework": FRAMEWORK, META: {"session_id": self.session_id}}
            with transaction.atomic():
                thread, created = storage.create_thread(agent=record, external_id=self.session_id, metadata=metadata)
                if created:
                    # An empty first checkpoint: branching from the first turn forks from here.
                    storage.append_checkpoint(thread=thread, parent=None, state={"items": []}, step=0,
                                            label="session", fence=self.fence)  # fmt: skip
            self._thread = thread
        return self._thread

    def read_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        head = self._resolve(refresh=True)
        if head is None:
            return []
        items = storage.load_node(head, hot=True).state.get("items", [])
        if limit is not None:
            items = items[-limit:] if limit > 0 else []
        return copy.deepcopy(items)

    def append_items(self, items: list[TResponseInputItem]) -> Checkpoint:
        turns = sum(1 for item in items if isinstance(item, dict) and item.get("role") == "user")
        ops = [{"op": "add", "path": "/items/-", "value": item} for item in items]
        return self.write(ops, turns=turns, label=_label(items))

    def pop(self) -> TResponseInputItem | None:
        items = self._head_items()
        if not items:
            return None
        last = copy.deepcopy(items[-1])
        is_user = isinstance(last, dict) and last.get("role") == "user"
        self.write([{"op": "remove", "path": f"/items/{len(items) - 1}"}], turns=-int(is_user), label="pop item")
        return last

    def clear(self) -> None:
        if self._head_items():
            assert self._head is not None  # _head_items found it
            self.write([{"op": "replace", "path": "/items", "value": []}], turns=-self._head[1], label="clear")

    def _head_items(self) -> list[TResponseInputItem]:
        """The items at the branch's head as read now (the cached state: not a copy)."""
        head = self._resolve(refresh=True)
        items = storage.load_node(head, hot=True).state.get("items") if head is not None else None
        return items if isinstance(items, list) else []

    def write(
        self,
        ops: list[dict[str, Any]],
        *,
        turns: int,
        label: str,
        status: str = CheckpointStatus.RUNNING,
        meta: dict[str, Any] | None = None,
    ) -> Checkpoint:
        """Append one checkpoint of `ops` after this session's head, `turns` user turns more (or
        fewer) than it, with this integration's metadata `meta` if any; returns it."""
        self._resolve()
        for _ in range(STALE_RETRIES):
            assert self._head is not None  # _resolve found the branch's head or its fork point
            parent, total_turns = self._head
            patch = list(ops)
            if self._paused and not any(op["path"] == f"/{RUN_STATE}" for op in ops):
                patch = [{"op": "remove", "path": f"/{RUN_STATE}"}, *patch]  # the paused run went on
            try:
                checkpoint = storage.append_checkpoint(
                    thread=self.thread, parent=parent, patch=patch, branch=self.branch, label=label, status=status,
                    step=total_turns + turns, metadata={META: meta} if meta else None, fence=self.fence,
                )  # fmt: skip
            except StaleParent:
                self._resolve(refresh=True)
                continue
            self._remember(checkpoint)
            return checkpoint
        raise StaleParent(f"Session {self.session_id!r}: other writers kept moving branch {self.branch!r} on.")

    def _resolve(self, *, refresh: bool = False) -> UUID | None:
        """This session's head on its branch (the fork point of a branch not yet written to)."""
        if self._head is not None and not refresh:
            return self._head[0]
        thread = self.thread
        if self.branch is None:
            active = thread.active_branch_id
            self.branch = storage.get_branch_name(active) if active is not None else storage.MAIN_BRANCH
        if self._branch_id is None:
            self._branch_id, self._fork_point = (
                Branch.objects.filter(thread=thread, name=self.branch).values_list("pk", "fork_point_id").get()
            )
        # The branch's newest checkpoint and its turns: one prepared statement, as each turn asks.
        with connection.cursor() as cursor:  # prepared by psycopg once it has run a few times
            cursor.execute(HEAD_SQL, {"thread": thread.pk, "branch": self._branch_id})
            row = cursor.fetchone()
        if row is not None:
            self._head, self._paused = (row[0], row[1] or 0), row[2]
        elif self._fork_point is not None:  # a branch not yet written to: its fork point
            self._remember(Checkpoint.objects.only("id", "step", "metadata").get(pk=self._fork_point))
        else:
            self._head = None
        return self._head[0] if self._head else None

    def _remember(self, checkpoint: Checkpoint) -> None:
        self._head = (checkpoint.pk, _turns(checkpoint))
        self._paused = bool((checkpoint.metadata.get(META) or {}).get("paused"))


def _turns(checkpoint: Checkpoint) -> int:
    """The user turns of the conversation after `checkpoint` (its step; in its metadata if it
    was written before the count moved there)."""
    if checkpoint.step is not None:
        return checkpoint.step
    return int((checkpoint.metadata.get(META) or {}).get("turns", 0))


def _line(thread: Thread, head: UUID | None) -> list[Checkpoint]:
    """`head` and its ancestors, newest first (ids, steps and metadata, read in one query)."""
    rows = {row.pk: row for row in Checkpoint.objects.filter(thread=thread).only("id", "parent_id", "step", "metadata")}
    found: list[Checkpoint] = []
    while head is not None and head in rows:
        found.append(rows[head])
        head = rows[head].parent_id
    return found


def _label(items: list[Any]) -> str:
    """What the timeline calls a write: the kinds of item it added (never their text)."""
    kinds = []
    for item in items:
        kind = item.get("type") or item.get("role") if isinstance(item, dict) else None
        if kind == "function_call":
            kind = f"call {item.get('name', '')}".strip()
        if kind and kind not in kinds:
            kinds.append(str(kind))
    return ", ".join(kinds)[:60] or "items"
