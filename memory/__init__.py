"""Long-term memory: items (a JSON value under a key in a namespace path) that outlive a thread,
read and written across threads by agents of any framework, with every version kept.

Its public surface, what the API, the SDK's endpoints and integrations.langgraph use:

- `memory.store`: the writes, one function each — `put_item`, `delete_item`, `refresh_expiry`,
  `sweep_expired` — with who wrote (`Author`) and from where (`Origin`);
- `memory.selectors`: the reads — `get_item`, `item_as_of`, `search_items`, `list_namespaces`,
  `item_history`, `item_reads`, `verify_item`; a read made from a thread (`memory.reads.Reader`)
  is recorded by `memory.reads`, a moment later, in one statement for many;
- `memory.changes`: every committed write, for the memory browser's open pages (`memory.consumers`);
- `memory.access`: whose memory a caller sees (`Scope`), and `memory.sharing`: grants between
  agents, audited;
- `memory.texts.IndexText` and `memory.vectors` (pgvector where the server has it);
- `memory.errors`: what the store refuses, each with its API code and status;
- `memory.boards`: blackboards — made once (`make_board`), leases with fencing tokens
  (`acquire_lease`, `renew_lease`, `release_lease`), and the event of every change, which the
  store's writes append under the board's row lock; `memory.consumers` is their websocket feed;
- `memory.api` (routes in `memory.urls`, under /api/v1/memory/): thin views over all of the above.

Values are stored as the checkpoint engine stores states, through its public primitives: canonical
JSON framed by `codec`, sealed by `crypto` under a data key per namespace (wrapped by the same
master keys), an HMAC chain per item from `codec.keyed_digest`, and large values as RFC 6902
deltas from `jsonpatch`. It must not import the engine's internals, the checkpoint views, approvals
or any integration; the core (checkpoints, approvals, agents, audit, quicksave) never imports it.
"""
