"""LangGraph's checkpointer interface on top of the Quicksave store: point a compiled graph at
`QuicksaveSaver()` and its threads show up on the dashboard, stored as deltas.

Mapping:

- One Quicksave thread per (LangGraph `thread_id`, `checkpoint_ns`) under one Quicksave agent
  (`langgraph` by default). Its `external_id` is the thread id, plus `#<ns>` for a subgraph;
  its metadata `{"langgraph": {"thread_id", "checkpoint_ns"}}` finds every namespace of a
  LangGraph thread through the thread metadata index.
- One LangGraph checkpoint is one Quicksave checkpoint, written by `storage.append_checkpoint_id`.
  Its state is the LangGraph checkpoint with JSON-safe channel values: a value that is plain
  JSON is stored as is (so a growing `messages` list is a delta of the appended items), lists
  and string-keyed dicts are walked, and anything else (LangChain messages, tuples, bytes…)
  becomes a `{"__lg_typed__": [type, base64]}` envelope made by LangGraph's own serde.
- The checkpoint's Quicksave metadata holds `lg_id` (LangGraph's checkpoint id), `lg_parent`
  and `lg_metadata`, so `parent_config` survives pruning and the LangGraph tree is kept even
  where the Quicksave tree differs from it.
- A put after a checkpoint this saver just wrote or read in the same (thread, namespace) is
  written as a patch of what changed. The saver keeps a private copy of that checkpoint's
  channel values (`Known`), which nobody else holds: channels LangGraph did not write (no new
  version) are left out, a list whose first items are equal in value to the copy's gets
  `add .../-` ops for the new ones (operator.add and add_messages append so), and only the
  rest is encoded and diffed. Equality, not identity: a message taken from `get_state()`,
  edited in place and sent back with `update_state()` differs from the copy and is stored.
  Any doubt (another writer's parent, an unknown parent) writes the full state, which the
  store diffs against the parent; both store the same state. A read of that checkpoint hands
  out fresh copies of the private lists rather than decoding every message again, and every
  read hands out objects no one else holds.
- A put whose parent is the head of its Quicksave branch extends that branch. A put after an
  older checkpoint (time travel, `update_state` on a past step, two writers racing) opens a
  new branch at that checkpoint, which is what a fork in the dashboard does too. A put with
  no parent in a thread that already has checkpoints starts a new root branch.

Pending writes are stored as rows of the tool-result cache (`ToolResult`), written through
`tools.add_tool_results`. That is what they are: the outputs of tasks that finished in a
superstep, kept so a resumed graph does not run those tasks again. Each row points at its
Quicksave checkpoint and is keyed by a hash of (LangGraph checkpoint id, task id, write
index), which makes `put_writes` idempotent as LangGraph requires. LangGraph's special writes
(error, interrupt, resume…) may be replaced by a later write with the same key; the cache is
append-only, so those rows' keys also hash the value and reads keep the newest row. A
dedicated table would index them better; the models of `checkpoints` are not this module's
to change, and a new app needs a settings change, so this is the honest fit for now.

An `__interrupt__` write in the root namespace files a pending approval on the thread
(integrations.langgraph.interrupts), once per interrupt; a decision queues a run that the
worker carries out by resuming the graph (integrations.langgraph.runner). LangGraph may save those
writes while the checkpoint's own put is still running; then the put files them.

Deleting (`delete_thread`, `prune`, `delete_for_runs`) removes whole Quicksave threads:
checkpoints are immutable links in an integrity chain, so removing some of them rebuilds the
thread from the checkpoints that stay (a new Quicksave thread id, same external id).

A LangGraph `DeltaChannel` stores a value only every so many updates; in between, its value
is rebuilt from the pending writes of the checkpoints before (`get_delta_channel_history`).
So `prune` keeps the latest checkpoint's ancestors back to the one each such channel is
rebuilt from, and `copy_thread` copies every checkpoint with its writes.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import math
import random
import threading
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping, Sequence
from operator import eq
from typing import Any, ParamSpec, TypeVar, cast
from uuid import UUID

from channels.db import database_sync_to_async
from django.db import IntegrityError, transaction
from django.db.models import Q
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    CheckpointMetadata,
    CheckpointTuple,
    DeltaChannelHistory,
    PendingWrite,
    get_checkpoint_id,
    get_checkpoint_metadata,
)
from langgraph.checkpoint.base import Checkpoint as LGCheckpoint
from langgraph.checkpoint.serde.base import SerializerProtocol
from langgraph.checkpoint.serde.types import INTERRUPT, RESUME

from checkpoints import storage
from checkpoints.ids import new_id
from checkpoints.models import Branch, Checkpoint, Thread, ToolResult
from checkpoints.storage import codec, lent_connection
from checkpoints.storage.errors import InvalidPatch, NotFound, StaleParent
from checkpoints.storage.tool_results import add_tool_results, put_tool_result
from integrations.langgraph import interrupts, tables
from integrations.langgraph.known import Known, KnownCheckpoints
from integrations.langgraph.tables import PendingWrites
from integrations.langgraph.values import (
    MISSING,
    PLAIN,
    TYPED,
    Ops,
    member_ops,
    pointer,
    private,
    scalar_dicts_ops,
    shallow_item,
    shallow_lists,
)
from quicksave_agents.fencing import Fence
from quicksave_agents.keys import get_or_create_agent
from quicksave_agents.models import Agent

P = ParamSpec("P")
R = TypeVar("R")

# Inside the saver `list` is a method, so its annotations name these instead.
StoredRows = list[tuple[Checkpoint, dict[str, Any], list[ToolResult]]]
Tuples = list[CheckpointTuple]
EncodedWrites = list[tuple[str, Any]]  # (channel, JSON-safe value)
Walked = list[tuple[UUID, str, frozenset[str]]]  # (row, LangGraph id, channels) per ancestor
# A put's outcome: the thread, the new row (None: there already), the private copy of the channel
# values, and the lists among them whose items are all shallow_item.
Written = tuple[Thread, UUID | None, dict[str, Any], frozenset[str]]
Rows = list[UUID]


def _borrowing_connection(method: Callable[P, R]) -> Callable[P, R]:
    """Run the call on the process's lent connection when its thread has none open, else on
    the thread's own, given back at the end if the call opened it.

    LangGraph runs a sync graph's checkpoint writes on short-lived executor threads; each
    would otherwise set up a connection of its own, and keep it (a pooled one: until the
    pool runs dry).
    """

    @functools.wraps(method)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        with lent_connection.borrowed():
            return method(*args, **kwargs)

    return wrapper


class QuicksaveSaver(BaseCheckpointSaver[str]):
    """A LangGraph checkpointer that writes through the Quicksave checkpoint store."""

    def __init__(
        self,
        *,
        agent: str = "langgraph",
        serde: SerializerProtocol | None = None,
        approvals: bool = True,
        fence: Fence | None = None,
        lease_held: Callable[[], bool] | None = None,
    ) -> None:
        """`agent` names the Quicksave agent the threads belong to (register the graph under the
        same name for the worker to resume it); `approvals=False` keeps interrupts out of the inbox.

        The worker passes the `fence` of the run it drives the graph for, and `lease_held`, which
        says whether it still holds the run: every write carries the fence, and a put or
        put_writes after the lease was lost raises LeaseLost, which ends the graph's run.
        """
        super().__init__(serde=serde)
        self.agent_name = agent
        self.approvals = approvals
        self.fence = fence
        self._lease_held = lease_held
        self._agent: Agent | None = None
        # Interrupts whose checkpoint was not written yet, by (Quicksave thread, LangGraph id):
        # put() files them. The lock orders put()'s look against put_writes()' note.
        self._unfiled: dict[tuple[UUID, str], list[tuple[str, Sequence[tuple[str, Any]]]]] = {}
        self._unfiled_lock = threading.Lock()
        self._known = KnownCheckpoints()
        # The (thread, namespace, LangGraph id) of the puts under way, whose rows put_writes()
        # would not find yet. Set operations are atomic, so no lock.
        self._putting: set[tuple[str, str, str]] = set()

    def _check_lease(self) -> None:
        if self.fence is not None and self._lease_held is not None and not self._lease_held():
            raise self.fence.lost()

    def get_next_version(self, current: str | int | float | None, channel: None) -> Any:
        """The version after `current`, in its form: an int after an int (1 to begin with), and
        after a string the string InMemorySaver and PostgresSaver make, so a thread moved here
        from one of them goes on with versions LangGraph can compare with the ones it has."""
        # Any: LangGraph's version type variable allows one type per saver, this one keeps both.
        if isinstance(current, str):
            return f"{int(current.split('.')[0]) + 1:032}.{random.random():016}"
        return 1 if current is None else current + 1

    # ------------------------------------------------------------------ encoding

    def _encode(self, value: Any) -> Any:
        """A JSON-safe form of `value`: plain JSON as is, everything else in a typed envelope."""
        kind = type(value)
        if value is None or kind in (str, bool, int):
            if kind is str and "\x00" in value:  # PostgreSQL's jsonb refuses NUL
                return self._envelope(value)
            return value
        if kind is float and math.isfinite(value):
            return value
        if kind is list:
            return [self._encode(item) for item in value]
        if kind is dict and TYPED not in value and all(type(key) is str and "\x00" not in key for key in value):
            return {key: self._encode(item) for key, item in value.items()}
        return self._envelope(value)

    def to_json(self, value: Any) -> Any:
        """`value` in the JSON-safe form the saver stores it in (approvals keep interrupt args so)."""
        return self._encode(value)

    def from_json(self, value: Any) -> Any:
        """The value `to_json` stored."""
        return self._decode(value)

    def _envelope(self, value: Any) -> dict[str, list[str]]:
        type_, data = self.serde.dumps_typed(value)
        return {TYPED: [type_, base64.b64encode(data).decode()]}

    def _decode(self, value: Any) -> Any:
        # A read decodes the whole state, so plain values are copied over without a call each.
        kind = type(value)
        if kind is list:
            return [item if type(item) in PLAIN else self._decode(item) for item in value]
        if kind is dict:
            if TYPED in value and len(value) == 1:
                type_, data = value[TYPED]
                return self.serde.loads_typed((type_, base64.b64decode(data)))
            decoded = value.copy()
            for key, item in value.items():
                if type(item) not in PLAIN:
                    decoded[key] = self._decode(item)
            return decoded
        return value

    # ------------------------------------------------------------------ threads

    def _get_agent(self) -> Agent:
        if self._agent is None:
            self._agent = get_or_create_agent(name=self.agent_name, description="LangGraph graphs")
        return self._agent

    def _thread(self, thread_id: str, checkpoint_ns: str, *, create: bool = False) -> Thread | None:
        thread_id = str(thread_id)  # LangGraph accepts any thread id; a UUID is common
        external_id = tables.external_id_for(thread_id, checkpoint_ns)
        if create:
            return storage.create_thread(
                agent=self._get_agent(),
                external_id=external_id,
                metadata={
                    "framework": "langgraph",
                    "langgraph": {"thread_id": thread_id, "checkpoint_ns": checkpoint_ns},
                },
            )[0]
        return Thread.objects.filter(agent=self._get_agent(), external_id=external_id).first()

    def _threads(self, thread_id: str | None, checkpoint_ns: str | None) -> list[Thread]:
        """The Quicksave threads a LangGraph (thread, namespace) selection covers."""
        if thread_id is not None and checkpoint_ns is not None:
            thread = self._thread(thread_id, checkpoint_ns)
            return [thread] if thread is not None else []
        threads = Thread.objects.filter(agent=self._get_agent())
        if thread_id is not None:
            threads = threads.filter(metadata__contains={"langgraph": {"thread_id": thread_id}})
        return list(threads)

    @staticmethod
    def _names(thread: Thread) -> tuple[str, str]:
        info = thread.metadata.get("langgraph", {})
        return info.get("thread_id", thread.external_id or ""), info.get("checkpoint_ns", "")

    # ------------------------------------------------------------------ reads

    @_borrowing_connection
    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        configurable = config["configurable"]
        thread_id, checkpoint_ns = str(configurable["thread_id"]), configurable.get("checkpoint_ns", "")
        lg_id = get_checkpoint_id(config)
        found = tables.checkpoint_with_writes(
            agent_id=self._get_agent().pk, thread_id=thread_id, checkpoint_ns=checkpoint_ns, lg_id=lg_id
        )
        if not found:
            return None
        row, thread_pk, metadata = found[0][0], found[0][1], tables.jsonb(found[0][2])
        # A ToolResult opens its sealed result (bound to its thread and key) when read.
        results = [
            ToolResult(thread_id=thread_pk, key=key, result=bytes(sealed)).result for *_, key, sealed in found if key
        ]
        known = self._known.get(thread_id, checkpoint_ns)
        reuse = known.lists() if known is not None and known.row == row and known.thread.pk == thread_pk else {}
        read = self._tuple(
            thread_id, checkpoint_ns, row, metadata, tables.pending_writes(results, self._decode), reuse=reuse
        )
        thread = (
            known.thread if known is not None and known.thread.pk == thread_pk else Thread.objects.get(pk=thread_pk)
        )
        # The graph goes on from these values: remember a copy of them, so the next put sees what changed.
        if known is None or known.row != row or known.thread.pk != thread_pk:
            held = {name: private(value) for name, value in read.checkpoint["channel_values"].items()}
            known = Known(thread=thread, lg_id=metadata["lg_id"], row=row, values=held, shallow=shallow_lists(held))
            self._known.remember(thread_id, checkpoint_ns, known)
        return read

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        yield from self._list(config, filter=filter, before=before, limit=limit)

    @_borrowing_connection
    def _list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None,
        before: RunnableConfig | None,
        limit: int | None,
    ) -> Tuples:
        configurable = config["configurable"] if config else {}
        threads = {t.pk: t for t in self._threads(configurable.get("thread_id"), configurable.get("checkpoint_ns"))}
        if not threads:
            return []
        rows = tables.by_lg_id(Checkpoint.objects.filter(thread_id__in=list(threads)))
        if checkpoint_id := configurable.get("checkpoint_id"):
            rows = rows.filter(_lg_order=checkpoint_id)
        if before is not None and (before_id := get_checkpoint_id(before)):
            rows = rows.filter(_lg_order__lt=before_id)
        if filter:
            # Containment narrows in SQL; equality is then checked exactly, as LangGraph's savers do.
            rows = rows.filter(metadata__contains={"lg_metadata": self._encode(filter)})
        matched: list[Checkpoint] = []
        for row in rows.iterator(chunk_size=100):
            lg_metadata = row.metadata.get("lg_metadata", {})
            if filter and any(lg_metadata.get(key) != self._encode(value) for key, value in filter.items()):
                continue
            matched.append(row)
            if limit is not None and len(matched) >= limit:
                break
        found: Tuples = []
        for start in range(0, len(matched), 100):
            batch = matched[start : start + 100]
            writes = self._writes(batch)
            found.extend(
                self._tuple(*self._names(threads[row.thread_id]), row.pk, row.metadata, writes) for row in batch
            )
        return found

    def _tuple(
        self,
        thread_id: str,
        checkpoint_ns: str,
        row: UUID,
        metadata: dict[str, Any],
        writes: PendingWrites,
        *,
        reuse: dict[str, Any] | None = None,
    ) -> CheckpointTuple:
        """The tuple of a stored checkpoint; channels in `reuse` take those lists instead of
        decoding their stored values again (the same items, as this saver last saw them)."""
        # Decoding builds new containers, so the store's shared state needs no copy first.
        stored = storage.load_node(row).state
        state = {key: self._decode(value) for key, value in stored.items() if key != "channel_values"}
        channel_values = stored.get("channel_values", {})
        reuse = reuse or {}
        state["channel_values"] = {
            name: reuse[name] if name in reuse else self._decode(value) for name, value in channel_values.items()
        }
        checkpoint = cast(LGCheckpoint, state)
        parent = metadata.get("lg_parent")
        return CheckpointTuple(
            config=_config(thread_id, checkpoint_ns, metadata["lg_id"]),
            checkpoint=checkpoint,
            metadata=self._decode(metadata.get("lg_metadata", {})),
            parent_config=_config(thread_id, checkpoint_ns, parent) if parent else None,
            pending_writes=writes.get(metadata["lg_id"], []),
        )

    def _writes(self, rows: Iterable[Checkpoint]) -> PendingWrites:
        """Pending writes per LangGraph checkpoint id, the newest row winning per (task, index)."""
        by_thread: dict[UUID, list[str]] = {}
        for row in rows:
            by_thread.setdefault(row.thread_id, []).append(row.metadata["lg_id"])
        if not by_thread:
            return {}
        scope = Q()
        for thread_id, lg_ids in by_thread.items():
            scope |= Q(thread_id=thread_id, tool__in=[tables.write_tool(lg_id) for lg_id in lg_ids])
        stored = ToolResult.objects.filter(scope).order_by("created_at", "id")
        return tables.pending_writes((result.result for result in stored), self._decode)

    # ------------------------------------------------------------------ writes

    @_borrowing_connection
    def put(
        self,
        config: RunnableConfig,
        checkpoint: LGCheckpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        self._check_lease()
        configurable = config["configurable"]
        thread_id, checkpoint_ns = configurable["thread_id"], configurable.get("checkpoint_ns", "")
        key = (str(thread_id), checkpoint_ns)
        lg_id, lg_parent = checkpoint["id"], configurable.get("checkpoint_id")
        versions = checkpoint["channel_versions"]
        values = {name: value for name, value in checkpoint["channel_values"].items() if name in versions}
        lg_metadata = self._encode(get_checkpoint_metadata(config, metadata))
        known = self._known.get(*key) if lg_parent else None
        written = None
        self._putting.add((*key, lg_id))
        try:
            if known is not None and known.lg_id == lg_parent:
                written = self._put_patch(known, checkpoint, values, new_versions, lg_metadata)
            if written is None:
                written = self._put_state(*key, lg_parent, checkpoint, values, lg_metadata)
        finally:
            self._putting.discard((*key, lg_id))
        thread, row, held, shallow = written
        if row is None:
            self._known.forget(*key)
        else:
            previous = (known.lg_id, known.row) if known is not None and known.lg_id == lg_parent else None
            self._known.remember(
                *key, Known(thread=thread, lg_id=lg_id, row=row, values=held, shallow=shallow, previous=previous)
            )
        # Under the lock, always: a put_writes() that looked for this row just before it committed
        # may be noting its interrupts right now, and must either be seen here or see the row.
        with self._unfiled_lock:
            unfiled = self._unfiled.pop((thread.pk, lg_id), [])
        for task_id, writes in unfiled:
            self._interrupted(thread, lg_id, task_id, writes)
        return _config(thread_id, checkpoint_ns, lg_id)

    def _put_state(
        self,
        thread_id: str,
        checkpoint_ns: str,
        lg_parent: str | None,
        checkpoint: LGCheckpoint,
        values: dict[str, Any],
        lg_metadata: dict[str, Any],
    ) -> Written:
        """Write the checkpoint's full state, which the store diffs against its parent's.
        Returns the thread, the new row (None when the checkpoint was there already), a
        private copy of the channel values and which of them are lists of shallow_item items."""
        thread = self._thread(thread_id, checkpoint_ns, create=True)
        assert thread is not None
        state = {key: self._encode(value) for key, value in checkpoint.items() if key != "channel_values"}
        state["channel_values"] = {name: self._encode(value) for name, value in values.items()}
        if tables.with_lg_id(thread, checkpoint["id"]).exists():
            return thread, None, {}, frozenset()
        row = self._append(thread, lg_id=checkpoint["id"], lg_parent=lg_parent, lg_metadata=lg_metadata, state=state)
        held = {name: private(value) for name, value in values.items()}
        return thread, row, held, shallow_lists(held)

    def _put_patch(
        self,
        known: Known,
        checkpoint: LGCheckpoint,
        values: dict[str, Any],
        new_versions: ChannelVersions,
        lg_metadata: dict[str, Any],
    ) -> Written | None:
        """Write the checkpoint after `known`, its parent, as a patch of what changed; None when
        the full state must be written instead."""
        held: dict[str, Any] = {}
        shallow: set[str] = set()
        try:
            patch = self._patch(
                storage.load_node(known.row).state, known, checkpoint, values, new_versions, held, shallow
            )
            row = self._append(
                known.thread, lg_id=checkpoint["id"], lg_parent=known.lg_id, lg_metadata=lg_metadata, patch=patch,
                parent=known.row,
            )  # fmt: skip
        except (NotFound, InvalidPatch):
            # The thread or the parent is gone (deleted, rebuilt elsewhere), or what this saver
            # remembers does not fit what is stored: the full-state path looks everything up again.
            return None
        return known.thread, row, held, frozenset(shallow)

    def _patch(
        self,
        parent: dict[str, Any],
        known: Known,
        checkpoint: LGCheckpoint,
        values: dict[str, Any],
        new_versions: ChannelVersions,
        held: dict[str, Any],
        shallow: set[str],
    ) -> Ops:
        """RFC 6902 ops from the parent's stored state to the checkpoint's, encoding only what
        changed; fills `held` with the private copy of the checkpoint's channel values and
        `shallow` with the lists among them whose items are all shallow_item."""
        ops: Ops = []
        for key, value in checkpoint.items():
            if key != "channel_values":
                stored_member = parent.get(key, MISSING)
                fast = scalar_dicts_ops(stored_member, value, pointer(key))
                ops += fast if fast is not None else member_ops(stored_member, self._encode(value), pointer(key))
        ops += [{"op": "remove", "path": pointer(key)} for key in parent if key not in checkpoint]
        stored = parent.get("channel_values")
        if not isinstance(stored, dict):
            encoded = {name: self._encode(value) for name, value in values.items()}
            held.update((name, private(value)) for name, value in values.items())
            shallow.update(shallow_lists(held))
            return [*ops, {"op": "add", "path": "/channel_values", "value": encoded}]
        ops += [{"op": "remove", "path": pointer("channel_values", name)} for name in stored if name not in values]
        for name, value in values.items():
            channel_ops, held[name], is_shallow = self._channel_ops(
                name, value, stored.get(name, MISSING), known.values.get(name, MISSING),
                changed=name in new_versions, shallow=name in known.shallow,
            )  # fmt: skip
            if is_shallow:
                shallow.add(name)
            ops += channel_ops
        return ops

    def _channel_ops(
        self, name: str, value: Any, stored: Any, held: Any, *, changed: bool, shallow: bool
    ) -> tuple[Ops, Any, bool]:
        """Ops turning a channel's stored value into `value`, the private copy of `value`, and
        whether that copy is a list of shallow_item items (`shallow`: whether `held` is).

        O(change) when LangGraph did not write the channel, or when `value` is a list whose first
        items equal those of `held` (the private copy of the parent's value) and the rest are new:
        comparing is cheap next to encoding, and catches an item edited in place.
        """
        if not changed and stored is not MISSING and held is not MISSING:
            return [], held, shallow
        if (
            type(value) is list
            and type(held) is list
            and type(stored) is list
            and len(stored) == len(held) <= len(value)
            and all(map(eq, value, held))
        ):
            end = pointer("channel_values", name, "-")
            added = value[len(held) :]
            ops = [{"op": "add", "path": end, "value": self._encode(item)} for item in added]
            return ops, [*held, *map(private, added)], shallow and all(map(shallow_item, added))
        copied = private(value)
        ops = member_ops(stored, self._encode(value), pointer("channel_values", name))
        return ops, copied, type(copied) is list and all(map(shallow_item, copied))

    def _append(
        self,
        thread: Thread,
        *,
        lg_id: str,
        lg_parent: str | None,
        lg_metadata: dict[str, Any],
        state: dict[str, Any] | None = None,
        patch: Ops | None = None,
        parent: UUID | None = None,
    ) -> UUID | None:
        """Write one LangGraph checkpoint after its LangGraph parent, branching when that is not a head.

        Give the full `state`, or a `patch` against the state of `parent` (the parent's row, then
        known): a put that may repeat an earlier one was not looked for first, so it is looked for
        before branching, and None comes back when it is there. Returns the new row's id.
        """
        step = lg_metadata.get("step")
        fields: dict[str, Any] = {
            "state": state,
            "patch": patch,
            "label": str(lg_metadata.get("source", ""))[:200],
            "step": step if type(step) is int and 0 <= step < 2**31 else None,
            "metadata": {"lg_id": lg_id, "lg_parent": lg_parent, "lg_metadata": lg_metadata},
        }
        if parent is None and lg_parent:
            parent = tables.row_of(thread, lg_parent)
        if parent is None:
            assert patch is None, "a patch needs its parent"
            if not Checkpoint.objects.filter(thread=thread).exists():
                try:
                    return storage.append_checkpoint_id(thread=thread, parent=None, branch=storage.MAIN_BRANCH,
                                                        fence=self.fence, **fields)  # fmt: skip
                except StaleParent:
                    pass  # another writer started the thread first: this one is a second root
            return storage.append_checkpoint_id(
                thread=thread, parent=None, branch=self._root_branch(thread, lg_id), fence=self.fence, **fields
            )
        try:
            return storage.append_checkpoint_id(thread=thread, parent=parent, fence=self.fence, **fields)
        except StaleParent:
            pass  # the parent is not the head of its branch (a replay, a fork): branch off it
        if patch is not None and tables.row_of(thread, lg_id) is not None:
            return None
        branch = storage.start_branch(thread=thread, at=parent, name=_branch_name(lg_id))
        return storage.append_checkpoint_id(
            thread=thread, parent=parent, branch=branch.name, fence=self.fence, **fields
        )

    @staticmethod
    def _root_branch(thread: Thread, lg_id: str) -> str:
        """Open a branch with no fork point, for a LangGraph checkpoint without a parent."""
        name = _branch_name(lg_id)
        with transaction.atomic():
            Branch.objects.create(thread=thread, name=name, fork_point=None)
            storage.record_event(thread=thread, type="branch.created", data={"branch": name, "fork_point": None})
        return name

    @_borrowing_connection
    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        self._check_lease()
        configurable = config["configurable"]
        lg_id = configurable["checkpoint_id"]
        thread_id, checkpoint_ns = str(configurable["thread_id"]), configurable.get("checkpoint_ns", "")
        # LangGraph may save a task's writes before the checkpoint's own put has finished,
        # so a write is keyed by the LangGraph id; the link to the row is only a convenience.
        encoded = [(channel, self._encode(value)) for channel, value in writes]
        thread = None
        if (known := self._known.get(thread_id, checkpoint_ns)) is not None:
            thread = known.thread
            try:
                row = known.row_of(lg_id)
                # LangGraph ids grow with time: writes for a checkpoint newer than the one this
                # saver knows come before its put (async durability), so there is no row to find.
                if row is None and lg_id < known.lg_id:
                    row = self._row_of_writes(thread, (thread_id, checkpoint_ns, lg_id))
                self._store_writes(thread, row, lg_id, task_id, task_path, encoded)
            except (IntegrityError, NotFound):
                # The remembered thread was deleted (or rebuilt) since: look it up again.
                self._known.forget(thread_id, checkpoint_ns)
                thread = None
        if thread is None:
            thread = self._thread(thread_id, checkpoint_ns, create=True)
            assert thread is not None
            row = self._row_of_writes(thread, (thread_id, checkpoint_ns, lg_id))
            self._store_writes(thread, row, lg_id, task_id, task_path, encoded)
        if self.approvals and not checkpoint_ns and any(c == INTERRUPT for c, _ in writes):
            self._interrupted(thread, lg_id, task_id, writes)

    def _row_of_writes(self, thread: Thread, key: tuple[str, str, str]) -> UUID | None:
        """The row pending writes link to, by (thread, namespace, LangGraph id): none while its
        put is under way here, as it would not be found before that put commits."""
        return None if key in self._putting else tables.row_of(thread, key[2])

    def _store_writes(
        self, thread: Thread, row: UUID | None, lg_id: str, task_id: str, task_path: str, writes: EncodedWrites
    ) -> None:
        results = []
        for index, (channel, encoded) in enumerate(writes):
            idx = WRITES_IDX_MAP.get(channel, index)
            key_parts = [lg_id, task_id, str(idx)]
            if idx < 0:  # a special write replaces an earlier one: a new row, read newest-first
                key_parts.append(codec.to_canonical_bytes(encoded).hex())
            key = hashlib.sha256("\x00".join(key_parts).encode()).hexdigest()
            results.append((key, {
                "lg_id": lg_id, "task_id": task_id, "task_path": task_path, "idx": idx,
                "channel": channel, "value": encoded,
            }))  # fmt: skip
        # One statement, so one commit, however many writes the task made.
        add_tool_results(
            thread=thread, results=results, tool=tables.write_tool(lg_id), checkpoint=row, fence=self.fence
        )

    def _interrupted(self, thread: Thread, lg_id: str, task_id: str, writes: Sequence[tuple[str, Any]]) -> None:
        """File the approvals an interrupt asks for, or leave them to put() when LangGraph saved
        the writes before the checkpoint itself (it does both at once under async durability)."""
        with self._unfiled_lock:
            row = tables.row_of(thread, lg_id)
            if row is None:
                self._unfiled.setdefault((thread.pk, lg_id), []).append((task_id, list(writes)))
                return
        self._file_interrupts(thread, row, lg_id, task_id, writes)

    def _file_interrupts(
        self, thread: Thread, row: UUID, lg_id: str, task_id: str, writes: Sequence[tuple[str, Any]]
    ) -> None:
        resumes = [value for channel, value in writes if channel == RESUME]
        for channel, value in writes:
            if channel == INTERRUPT:
                interrupts.file_interrupts(
                    thread=thread, checkpoint_id=row, lg_id=lg_id, task_id=task_id,
                    interrupts=interrupts.pending_interrupts(value),
                    resumed=len(resumes[-1]) if resumes and isinstance(resumes[-1], list) else 0,
                    encode=self.to_json, fence=self.fence,
                )  # fmt: skip

    @_borrowing_connection
    def delete_thread(self, thread_id: str) -> None:
        self._known.forget(str(thread_id))
        for thread in self._threads(thread_id, None):
            _delete(thread)

    # ------------------------------------------------------------------ extended capabilities

    @_borrowing_connection
    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy every namespace of a thread, checkpoints and pending writes, under a new thread id."""
        self._known.forget(str(target_thread_id))
        for source in self._threads(source_thread_id, None):
            _, checkpoint_ns = self._names(source)
            with transaction.atomic():
                target = self._thread(target_thread_id, checkpoint_ns, create=True)
                assert target is not None
                self._write_rows(target, self._rows(source, keep=None))

    @_borrowing_connection
    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Remove the checkpoints (and their writes) that any of `run_ids` wrote."""
        if not run_ids:
            return
        doomed = Checkpoint.objects.filter(
            thread__agent=self._get_agent(), metadata__lg_metadata__run_id__in=list(run_ids)
        ).values_list("thread_id", "id")
        by_thread: dict[UUID, set[UUID]] = {}
        for thread_id, checkpoint_id in doomed:
            by_thread.setdefault(thread_id, set()).add(checkpoint_id)
        for thread in Thread.objects.filter(pk__in=list(by_thread)):
            keep = set(Checkpoint.objects.filter(thread=thread).values_list("id", flat=True)) - by_thread[thread.pk]
            self._rebuild(thread, keep=keep)

    @_borrowing_connection
    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """Keep only each namespace's latest checkpoint (`keep_latest`), with the ancestors its
        DeltaChannels are rebuilt from, or delete the threads (`delete`)."""
        if strategy not in ("keep_latest", "delete"):
            raise ValueError(f"Unknown prune strategy {strategy!r}; use 'keep_latest' or 'delete'.")
        for thread_id in thread_ids:
            self._known.forget(str(thread_id))
            for thread in self._threads(thread_id, None):
                latest = tables.by_lg_id(Checkpoint.objects.filter(thread=thread)).only("id", "metadata").first()
                if strategy == "delete" or latest is None:
                    _delete(thread)
                else:
                    self._rebuild(thread, keep={latest.pk, *self._delta_sources(thread, latest)})

    def _delta_sources(self, thread: Thread, latest: Checkpoint) -> Rows:
        """The rows a checkpoint's DeltaChannels are rebuilt from: its LangGraph ancestors back
        to the nearest one storing a value for each. LangGraph names the channels that have
        taken updates since their last stored value in `counters_since_delta_snapshot`."""
        counters = latest.metadata.get("lg_metadata", {}).get("counters_since_delta_snapshot")
        if not isinstance(counters, dict):
            return []
        state = storage.load_node(latest.pk).state
        versions, values = state.get("channel_versions", {}), state.get("channel_values", {})
        channels = [name for name in counters if name in versions and name not in values]
        if not channels:
            return []
        walked, _ = self._delta_walk(thread, latest.metadata["lg_id"], channels)
        return [row for row, _, _ in walked]

    # ------------------------------------------------------------------ delta channels

    @_borrowing_connection
    def get_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        """What each channel's value at a checkpoint is rebuilt from, for LangGraph's DeltaChannel,
        which stores a value only now and then: the value stored at the nearest LangGraph ancestor
        that has one (`seed`, left out when none has) and the channel's pending writes of the
        ancestors from that one on, oldest first, each checkpoint's in the order a superstep
        applies them. The checkpoint's own writes (for its next step) are not part of it."""
        if not channels:
            return {}
        configurable = config["configurable"]
        thread = self._thread(str(configurable["thread_id"]), configurable.get("checkpoint_ns", ""))
        found: dict[str, list[PendingWrite]] = {name: [] for name in channels}
        walked, seeds = self._delta_walk(thread, get_checkpoint_id(config), channels) if thread else ([], {})
        if thread is not None and walked:
            tools = [tables.write_tool(lg_id) for _, lg_id, _ in walked]
            stored = ToolResult.objects.filter(thread=thread, tool__in=tools).order_by("created_at", "id")
            writes = tables.latest_writes(result.result for result in stored)
            for _, lg_id, wanted in reversed(walked):
                for write in writes.get(lg_id, []):
                    if (channel := write["channel"]) in wanted:
                        found[channel].append((write["task_id"], channel, self._decode(write["value"])))
        history: dict[str, DeltaChannelHistory] = {}
        for name in channels:
            history[name] = {"writes": found[name]}
            if name in seeds:
                history[name]["seed"] = self._decode(seeds[name])
        return history

    def _delta_walk(self, thread: Thread, lg_id: str | None, channels: Iterable[str]) -> tuple[Walked, dict[str, Any]]:
        """Walk the LangGraph ancestors of a checkpoint (the thread's latest when `lg_id` is None),
        parent first, until each channel has met one storing a value for it. Returns the
        ancestors walked as (row, LangGraph id, the channels whose writes there count) and the
        stored (encoded) value each channel stopped at."""
        if lg_id is None:
            lg_id = (
                tables.by_lg_id(Checkpoint.objects.filter(thread=thread)).values_list("_lg_order", flat=True).first()
            )
        remaining, walked, seeds = set(channels), Walked(), {}
        for row, ancestor in tables.ancestors(thread, lg_id) if lg_id else ():
            if not remaining:
                break
            # The ancestor's own writes led to the next checkpoint on the path: they count even
            # where its stored value ends the walk.
            walked.append((row, ancestor, frozenset(remaining)))
            values = storage.load_node(row).state.get("channel_values") or {}
            for name in [name for name in remaining if name in values]:
                seeds[name] = values[name]
                remaining.discard(name)
        return walked, seeds

    def _rebuild(self, thread: Thread, *, keep: set[UUID]) -> None:
        """Replace a thread by one holding only the checkpoints in `keep` (and their writes)."""
        self._known.forget(*self._names(thread))
        with transaction.atomic():
            locked = Thread.objects.select_for_update().get(pk=thread.pk)
            external_id, metadata = locked.external_id, locked.metadata
            rows = self._rows(locked, keep=keep)
            _delete(locked)
            target, _ = storage.create_thread(agent=self._get_agent(), external_id=external_id, metadata=metadata)
            self._write_rows(target, rows)

    def _rows(self, source: Thread, *, keep: set[UUID] | None) -> StoredRows:
        """The source's checkpoints in write order with their states and pending-write rows."""
        rows = Checkpoint.objects.filter(thread=source).order_by("created_at", "id")
        if keep is not None:
            rows = rows.filter(pk__in=list(keep))
        writes: dict[str, list[ToolResult]] = {}
        pending = ToolResult.objects.filter(thread=source, tool__startswith=f"{tables.WRITE_TOOL}:")
        for result in pending.order_by("created_at", "id"):
            writes.setdefault(result.result["lg_id"], []).append(result)
        return [(row, storage.state_at(row.pk), writes.get(row.metadata["lg_id"], [])) for row in rows]

    def _write_rows(self, target: Thread, rows: StoredRows) -> None:
        for row, state, writes in rows:
            written = self._append(
                target,
                lg_id=row.metadata["lg_id"],
                lg_parent=row.metadata.get("lg_parent"),
                lg_metadata=row.metadata.get("lg_metadata", {}),
                state=state,
            )
            for write in writes:
                put_tool_result(thread=target, key=write.key, tool=write.tool, checkpoint=written, result=write.result)

    # ------------------------------------------------------------------ async

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return await database_sync_to_async(self.get_tuple)(config)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        found = await database_sync_to_async(self._list)(config, filter=filter, before=before, limit=limit)
        for item in found:
            yield item

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: LGCheckpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        return await database_sync_to_async(self.put)(config, checkpoint, metadata, new_versions)

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        await database_sync_to_async(self.put_writes)(config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        await database_sync_to_async(self.delete_thread)(thread_id)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await database_sync_to_async(self.copy_thread)(source_thread_id, target_thread_id)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        await database_sync_to_async(self.delete_for_runs)(run_ids)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        await database_sync_to_async(self.prune)(thread_ids, strategy=strategy)

    async def aget_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        return await database_sync_to_async(self.get_delta_channel_history)(config=config, channels=channels)


def _config(thread_id: str, checkpoint_ns: str, checkpoint_id: str) -> RunnableConfig:
    return {"configurable": {"thread_id": thread_id, "checkpoint_ns": checkpoint_ns, "checkpoint_id": checkpoint_id}}


def _branch_name(lg_id: str) -> str:
    # A LangGraph id names one checkpoint, but a rebuilt or racing thread may fork at it twice.
    return f"lg-{lg_id}-{new_id().hex[:8]}"


def _delete(thread: Thread) -> None:
    """Delete a Quicksave thread with everything in it."""
    storage.delete_thread(thread)
