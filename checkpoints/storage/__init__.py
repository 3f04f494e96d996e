"""The checkpoint storage engine: the one writer of the checkpoint chain and the reader of its states.

It owns the `checkpoints_checkpoint`, `_branch`, `_event`, `_materialisedhead`, `_threadkey`,
`_blob`, `_snapshotchunk` and `_toolresult` rows as the engine writes them: a checkpoint's payload
(a delta or a snapshot, framed by `codec`, a large snapshot in chunks its thread's snapshots share
(`chunks`), sealed by `crypto`, large values offloaded by `blobs`), its
integrity MAC chained from its parent's, and what saves replays (this process's `nodes`, and
each branch's materialised head in PostgreSQL).

Callers (the API, the pages, forks, retention, export, the LangGraph integration, agents and
approvals) use the names below: append, read a state (with `cache=False` around this process's
cache; `states_along`: every state of a trajectory in one replay), diff, a value's history
(`history`, with its `_changedpath` index), the thread and branch writes, the tool-result cache,
and for lifecycle work the payload primitives, integrity checks and `rewrite_chain` (compaction's
only way to change stored rows). The modules behind them are internal; the primitives a few
callers need by module are `codec` (framing and MACs, and `keyed_digest` for records outside the
chain), `crypto` (sealing a value to its row, under a thread's key or, with `wrap_key` and
`seal_with`, a key the caller keeps: memory's namespaces), `jsonpatch` (RFC 6902), `lru` (the one
cache helper), `blobs` (reading an offloaded value) and `lent_connection`; `kept_cursor`, the cursor
kept with a connection that the engine's hottest statements run on, runs memory's put too.

It must not import views, templates or presentation (`checkpoints.views`, `diffview`,
`timeline`, `svg`), nor approvals or agents beyond `quicksave_agents.fencing` (the lease check its
append statement embeds) and the `Agent` model a thread belongs to.
"""

from checkpoints.storage.append import append_checkpoint, append_checkpoint_id
from checkpoints.storage.branches import MAIN_BRANCH, branch_head, get_branch_name
from checkpoints.storage.cursors import kept_cursor
from checkpoints.storage.errors import (
    IntegrityFailure,
    InvalidPatch,
    InvalidPath,
    InvalidState,
    NotFound,
    StaleParent,
    StateTooLarge,
    StoreError,
)
from checkpoints.storage.garbage import Collected, collect_garbage
from checkpoints.storage.history import ABSENT, ValueChange, value_history
from checkpoints.storage.history import decode_cursor as decode_history_cursor
from checkpoints.storage.history import encode_cursor as encode_history_cursor
from checkpoints.storage.nodes import Node
from checkpoints.storage.payloads import Row, decode_payload, encode_payload, mac_fields, payload_ad
from checkpoints.storage.reads import (
    REPLAY_BUDGET,
    REPLAY_COST_PER_BYTE,
    clear_caches,
    clone,
    diff,
    latest_state,
    load_node,
    needs_snapshot,
    release_thread,
    state_at,
    states_along,
)
from checkpoints.storage.rewrite import Relinked, rewrite_chain
from checkpoints.storage.threads import (
    create_thread,
    delete_thread,
    events_after,
    record_event,
    set_thread_status,
    start_branch,
)
from checkpoints.storage.tool_results import (
    MAX_KEY_LENGTH,
    MAX_TOOL_LENGTH,
    add_tool_results,
    get_tool_result,
    put_tool_result,
    put_tool_results,
    tool_key,
    valid_key,
)
from checkpoints.storage.verify import Problem, mac_matches, verify_thread

__all__ = [
    "ABSENT",
    "MAIN_BRANCH",
    "MAX_KEY_LENGTH",
    "MAX_TOOL_LENGTH",
    "REPLAY_BUDGET",
    "REPLAY_COST_PER_BYTE",
    "Collected",
    "IntegrityFailure",
    "InvalidPatch",
    "InvalidPath",
    "InvalidState",
    "Node",
    "NotFound",
    "Problem",
    "Relinked",
    "Row",
    "StaleParent",
    "StateTooLarge",
    "StoreError",
    "ValueChange",
    "add_tool_results",
    "append_checkpoint",
    "append_checkpoint_id",
    "branch_head",
    "clear_caches",
    "clone",
    "collect_garbage",
    "create_thread",
    "decode_history_cursor",
    "decode_payload",
    "delete_thread",
    "diff",
    "encode_history_cursor",
    "encode_payload",
    "events_after",
    "get_branch_name",
    "get_tool_result",
    "kept_cursor",
    "latest_state",
    "load_node",
    "mac_fields",
    "mac_matches",
    "needs_snapshot",
    "payload_ad",
    "put_tool_result",
    "put_tool_results",
    "record_event",
    "release_thread",
    "rewrite_chain",
    "set_thread_status",
    "start_branch",
    "state_at",
    "states_along",
    "tool_key",
    "valid_key",
    "value_history",
    "verify_thread",
]
