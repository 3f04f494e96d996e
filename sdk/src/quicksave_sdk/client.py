"""The Quicksave client: threads, checkpoints sent as client-computed patches, the tool-call log,
approvals and runs, over the REST API v1 with one keep-alive HTTP connection pool.

Where the OpenTelemetry API is installed, every request carries the caller's trace context
(`traceparent`), so the server's spans join the agent's trace, and `serve` handles each run in a
span continuing the trace of the request that queued it; without it, nothing is sent.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import inspect
import json
import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from types import TracebackType
from typing import Any

import httpx

from quicksave_sdk.errors import CallInDoubt, LeaseLost, NotFound, error_from_response
from quicksave_sdk.jsonpatch import make_patch
from quicksave_sdk.memory import Memory

try:  # optional: an agent that traces has the OpenTelemetry API installed
    from opentelemetry import propagate as _propagate
    from opentelemetry import trace as _trace
except ImportError:  # pragma: no cover - exercised where the API is absent
    _propagate = None  # type: ignore[assignment]
    _trace = None  # type: ignore[assignment]

__version__ = "0.2.0"
API = "/api/v1"
log = logging.getLogger("quicksave_sdk")


def _send_trace_context(request: httpx.Request) -> None:
    """httpx's request hook: the current trace context as W3C headers (none outside a span)."""
    if _propagate is not None:
        _propagate.inject(request.headers)


@contextlib.contextmanager
def _continuing(run: Run) -> Iterator[None]:
    """A span for handling `run`, continuing the trace of the request that queued it."""
    if _trace is None or _propagate is None:
        yield
        return
    parent = _propagate.extract(run.trace_context) if run.trace_context else None
    tracer = _trace.get_tracer("quicksave_sdk", __version__)
    attributes = {"quicksave.run": run.id, "quicksave.run.reason": run.reason, "quicksave.thread": run.thread_id}
    with tracer.start_as_current_span("quicksave_sdk.run", context=parent, attributes=attributes):
        yield


def tool_key(name: str, args: Any) -> str:
    """The tool cache key of a call: SHA-256 of the canonical JSON of `[name, args]` (the server's own rule)."""
    return hashlib.sha256(_dumps([name, args], sort_keys=True).encode("utf-8")).hexdigest()


def call_key(thread_id: str, checkpoint_id: str | None, position: int) -> str:
    """The idempotency key of the `position`th call made after `checkpoint_id`: the same on every
    replay from that checkpoint (the in-process runtime's rule)."""
    return hashlib.sha256(f"quicksave-call/{thread_id}/{checkpoint_id or 'root'}/{position}".encode()).hexdigest()


def _takes_key(fn: Callable[..., Any]) -> bool:
    try:
        parameters = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return "idempotency_key" in parameters or any(p.kind is p.VAR_KEYWORD for p in parameters.values())


def _dumps(value: Any, *, sort_keys: bool = False) -> str:
    return json.dumps(value, sort_keys=sort_keys, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _json_copy(value: Any) -> Any:
    """A private deep copy, normalised to what the server stores (tuples become lists; NaN is refused)."""
    return json.loads(_dumps(value))


def _time(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value) if value else None


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint's summary; `state` is filled only by `Client.checkpoint()`."""

    id: str
    thread_id: str
    branch: str
    parent_id: str | None
    seq: int
    step: int | None
    label: str
    status: str
    model: dict[str, Any] | None
    metadata: dict[str, Any]
    storage: str  # "snapshot" or "delta": how the server stored it
    state_bytes: int
    created_at: datetime | None
    state: dict[str, Any] | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Checkpoint:
        return cls(
            id=data["id"], thread_id=data["thread"], branch=data["branch"], parent_id=data["parent"],
            seq=data["seq"], step=data["step"], label=data["label"], status=data["status"], model=data["model"],
            metadata=data["metadata"], storage=data["storage"], state_bytes=data["state_bytes"],
            created_at=_time(data["created_at"]), state=data.get("state"),
        )  # fmt: skip


@dataclass(frozen=True)
class Approval:
    """An approval request; `decision` is None while pending, else `{status, args, comment, decided_by, ...}`."""

    id: str
    thread_id: str
    checkpoint_id: str
    action: str
    args: Any
    message: str
    risk: str
    status: str
    expires_at: datetime | None
    created_at: datetime | None
    decision: dict[str, Any] | None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Approval:
        return cls(
            id=data["id"], thread_id=data["thread"], checkpoint_id=data["checkpoint"], action=data["action"],
            args=data["args"], message=data["message"], risk=data["risk"], status=data["status"],
            expires_at=_time(data["expires_at"]), created_at=_time(data["created_at"]), decision=data["decision"],
        )  # fmt: skip


@dataclass(frozen=True)
class ToolCall:
    """A logged tool call: `state` is pending (started, no result), done, in_doubt or retry."""

    key: str
    tool: str
    state: str
    idempotent: bool
    attempt: int | None
    starts: int
    result: Any

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ToolCall:
        return cls(key=data["key"], tool=data["tool"], state=data["state"], idempotent=data["idempotent"],
                   attempt=data["attempt"], starts=data["starts"], result=data["result"])  # fmt: skip


@dataclass(frozen=True)
class ToolResult:
    """A cached tool result: the first result stored under `key` in a thread."""

    key: str
    tool: str
    result: Any
    checkpoint_id: str | None
    created_at: datetime | None


class Client:
    """A connection to one Quicksave server, authenticated with an agent key.

    `transport` is handed to httpx (e.g. for retries or tests). Errors the server
    answers are raised as `QuicksaveError` subclasses; network failures stay httpx errors.
    """

    def __init__(
        self, base_url: str, api_key: str, *, timeout: float = 30, transport: httpx.BaseTransport | None = None
    ) -> None:
        self.timeout = timeout
        self._http = httpx.Client(
            base_url=base_url,
            headers={"Authorization": f"Bearer {api_key}", "Accept": "application/json",
                     "User-Agent": f"quicksave-sdk/{__version__}"},
            timeout=timeout,
            transport=transport,
            event_hooks={"request": [_send_trace_context]},
        )  # fmt: skip
        self.memory = Memory(self)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()

    def request(self, method: str, path: str, body: Any = None, *, timeout: float | None = None) -> Any:
        """Call any API path (relative to /api/v1); returns the decoded JSON, or None for 204."""
        headers = {"Content-Type": "application/json"} if body is not None else {}
        response = self._http.request(
            method,
            API + path,
            content=_dumps(body).encode("utf-8") if body is not None else None,
            headers=headers,
            timeout=timeout if timeout is not None else self.timeout,
        )
        if response.status_code >= 400:
            try:
                decoded = response.json()
            except ValueError:
                decoded = None
            raise error_from_response(response.status_code, decoded, response.text)
        return response.json() if response.status_code != 204 and response.content else None

    def thread(
        self,
        *,
        external_id: str | None = None,
        metadata: dict[str, Any] | None = None,
        agent: str | None = None,
        started_by: str | None = None,
    ) -> Thread:
        """Get or create the thread with `external_id` (a new thread without one), loaded at its head.

        `agent` defaults to the key's own agent. `started_by` names the person (a Quicksave user
        name) the agent runs the thread for; an approval policy may keep them from approving it.
        """
        body: dict[str, Any] = {"external_id": external_id}
        if metadata is not None:
            body["metadata"] = metadata
        if agent is not None:
            body["agent"] = agent
        if started_by is not None:
            body["started_by"] = started_by
        thread = Thread(self, self.request("POST", "/threads/", body))
        thread._move_to(thread._server_head)
        return thread

    def thread_by_id(self, thread_id: str, *, at: str | None = None) -> Thread:
        """Load a thread at checkpoint `at` (default: its head), e.g. to resume a claimed run from its checkpoint."""
        thread = Thread(self, self.request("GET", f"/threads/{thread_id}/"))
        thread._move_to(at or thread._server_head)
        return thread

    def checkpoint(self, checkpoint_id: str) -> Checkpoint:
        """A checkpoint with its full `state`, materialised and integrity-checked by the server."""
        return Checkpoint.from_json(self.request("GET", f"/checkpoints/{checkpoint_id}/"))

    def approval(self, approval_id: str) -> Approval:
        return Approval.from_json(self.request("GET", f"/approvals/{approval_id}/"))

    def claim(self, *, wait: float = 0) -> Run | None:
        """Claim the oldest open run of this key's agent, waiting up to `wait` seconds (≤ 30) for one; None if none."""
        data = self.request("POST", "/runs/claim/", {"wait": wait}, timeout=self.timeout + wait)
        return Run(self, data["run"]) if data else None

    def serve(
        self, handle: Callable[[Run], None], *, wait: float = 30, stop: threading.Event | None = None,
        max_runs: int | None = None, verify_environment: Callable[[list[dict[str, str]]], list[str]] | None = None,
    ) -> int:  # fmt: skip
        """The agent's loop: claim a run, hand it to `handle`, close it; repeat until `stop` is set
        (or `max_runs` runs were handled). Returns how many runs were handled.

        With `verify_environment` (`quicksave_sdk.environment.check_local`, or your own), a run
        that resumes a fork first has the environment its checkpoint recorded checked: if
        anything changed, the thread fails there with a message saying what, and `handle` never
        sees the run.

        A heartbeat keeps each run's lease while `handle` works. `handle` returning completes the
        run; raising fails it with the error. `LeaseLost` (another attempt took the run over: this
        one was frozen or cut off past its lease) and `CallInDoubt` (a person decides; the answer
        queues the next run) end only that run, cleanly: the loop goes on.
        """
        handled = 0
        while not (stop is not None and stop.is_set()) and (max_runs is None or handled < max_runs):
            run = self.claim(wait=wait)
            if run is None:
                continue
            handled += 1
            with run.keeping_lease(), _continuing(run):
                try:
                    if (
                        verify_environment is not None
                        and run.reason == "fork"
                        and self._environment_changed(run, verify_environment)
                    ):
                        self._close(run.complete)
                        continue
                    handle(run)
                except LeaseLost as lost:
                    log.warning("run %s: lease lost, stopping it (%s)", run.id, lost.message)
                    continue
                except CallInDoubt as doubt:
                    log.warning("run %s: a call is in doubt; a person decides (approval %s)", run.id, doubt.approval)
                    self._close(run.complete)
                    continue
                except Exception as exc:
                    log.exception("run %s failed", run.id)
                    self._close(functools.partial(run.fail, f"{type(exc).__name__}: {exc}"))
                    continue
            self._close(run.complete)
        return handled

    def _environment_changed(self, run: Run, verify: Callable[[list[dict[str, str]]], list[str]]) -> bool:
        """Check a fork's recorded environment; on a mismatch fail the thread at the run's
        checkpoint (as the server's runtime does) and say so."""
        references = list(self.checkpoint(run.checkpoint_id).metadata.get("environment", []))
        changed = verify(references) if references else []
        if not changed:
            return False
        thread = run.thread()
        reason = (
            f"The environment changed since checkpoint {run.checkpoint_id} was written: {'; '.join(changed)}. "
            "Not resuming on a changed world: restore it, or fork from a checkpoint that matches it."
        )
        log.warning("run %s: %s", run.id, reason)
        thread.checkpoint(thread.state, status="failed", label="environment changed",
                          metadata={"error": reason, "environment_mismatch": changed})  # fmt: skip
        return True

    @staticmethod
    def _close(close: Callable[[], None]) -> None:
        try:
            close()
        except LeaseLost as lost:
            log.warning("run already taken over: %s", lost.message)


class Thread:
    """One thread as this process sees it: its id, the head it last saw, and a private copy of that head's state.

    `checkpoint()` sends only the patch from that copy to the new state. When another
    writer moved the head meanwhile, it raises `StaleParent`; call `refresh()` to
    re-read the head and decide what to write.
    """

    def __init__(self, client: Client, data: dict[str, Any], *, fence: str | None = None) -> None:
        self._client = client
        self.id: str = data["id"]
        self._head: str | None = None
        self._state: dict[str, Any] = {}
        # The run attempt this object writes for (`Run.thread()`): every write carries its fence.
        self.fence = fence
        self._calls = 0  # calls made since the head: each call's position, for its key
        self._absorb(data)

    def _absorb(self, data: dict[str, Any]) -> None:
        self.agent: str = data["agent"]
        self.external_id: str | None = data["external_id"]
        self.status: str = data["status"]
        self.metadata: dict[str, Any] = data["metadata"]
        self._server_head: str | None = data["head"]["id"] if data["head"] else None

    def __repr__(self) -> str:
        return f"<Thread {self.id} head={self._head}>"

    @property
    def head(self) -> str | None:
        """The id of the checkpoint this object writes after; None before the first checkpoint."""
        return self._head

    @property
    def state(self) -> dict[str, Any]:
        """A copy of the head's state ({} before the first checkpoint): edit it and pass it to `checkpoint()`."""
        state: dict[str, Any] = _json_copy(self._state)
        return state

    def _move_to(self, checkpoint_id: str | None) -> None:
        self._calls = 0
        if checkpoint_id is None:
            self._head, self._state = None, {}
            return
        checkpoint = self._client.checkpoint(checkpoint_id)
        if checkpoint.thread_id != self.id:
            raise ValueError(f"Checkpoint {checkpoint_id} is not in thread {self.id}.")
        self._head, self._state = checkpoint.id, checkpoint.state or {}

    def refresh(self) -> None:
        """Re-read the thread and move to its current head, loading the head's state when it changed."""
        self._absorb(self._client.request("GET", f"/threads/{self.id}/"))
        if self._server_head != self._head:
            self._move_to(self._server_head)

    def checkpoint(
        self,
        state: dict[str, Any],
        *,
        step: int | None = None,
        label: str = "",
        status: str = "running",
        model: dict[str, Any] | None = None,
        metadata: dict[str, Any] | None = None,
        tool_results: list[dict[str, Any]] | None = None,
    ) -> Checkpoint:
        """Save `state` after the head: the full state the first time, then the patch from the head's state.

        Raises `StaleParent` (with `.head`) when the head moved; this object is left unchanged.
        """
        if not isinstance(state, dict):
            raise TypeError(f"state must be a dict, not {type(state).__name__}")
        new_state: dict[str, Any] = _json_copy(state)
        body: dict[str, Any] = {"parent": self._head, "label": label, "status": status}
        if self._head is None:
            body["state"] = new_state
        else:
            body["patch"] = make_patch(self._state, new_state)
        optional = {"step": step, "model": model, "metadata": metadata, "tool_results": tool_results,
                    "fence": self.fence}  # fmt: skip
        body.update((name, value) for name, value in optional.items() if value is not None)
        checkpoint = Checkpoint.from_json(self._client.request("POST", f"/threads/{self.id}/checkpoints/", body))
        self._head, self._state, self._calls = checkpoint.id, new_state, 0
        return checkpoint

    def cached_tool_result(self, key: str) -> ToolResult | None:
        """The result cached under `key` in this thread, or None."""
        try:
            data = self._client.request("GET", f"/threads/{self.id}/tool-results/{key}/")
        except NotFound:
            return None
        return ToolResult(
            key=data["key"], tool=data["tool"], result=data["result"], checkpoint_id=data["checkpoint"],
            created_at=_time(data["created_at"]),
        )  # fmt: skip

    def tool(self, name: str, args: Any, fn: Callable[..., Any], *, idempotent: bool = False) -> Any:
        """`fn(**args)` (or `fn(args)` when args is not a dict), run at most once for this place in the step.

        The call's intent is logged before `fn` runs and its result after, under a key that is the
        same when the step is replayed from the same checkpoint (`call_key`): a replay gets the
        logged result without calling `fn`. `fn` gets the key as `idempotency_key` when it takes
        that argument. A call that was started (by an attempt that died) and has no result raises
        `CallInDoubt` and is not run, unless `idempotent=True` says running it again under the same
        key does no harm. Raises `LeaseLost` when this object's run attempt lost its run.
        """
        key = call_key(self.id, self._head, self._calls)
        self._calls += 1
        begun = self._client.request(
            "PUT", f"/threads/{self.id}/tool-calls/{key}/",
            {"tool": name[:200], "args": args, "idempotent": idempotent, "fence": self.fence},
        )  # fmt: skip
        if not begun["proceed"]:
            return begun["result"]
        extra = {"idempotency_key": key} if _takes_key(fn) else {}
        result = fn(**args, **extra) if isinstance(args, dict) else fn(args, **extra)
        done = self._client.request(
            "PUT", f"/threads/{self.id}/tool-calls/{key}/result/", {"result": result, "fence": self.fence}
        )
        return done["result"]

    def tool_call(self, key: str) -> ToolCall | None:
        """The call logged under `key` in this thread, or None."""
        try:
            return ToolCall.from_json(self._client.request("GET", f"/threads/{self.id}/tool-calls/{key}/"))
        except NotFound:
            return None

    def request_approval(
        self,
        action: str,
        args: Any,
        *,
        message: str = "",
        risk: str = "high",
        expires_at: datetime | str | None = None,
    ) -> Approval:
        """Suspend the thread at its head until a person approves or rejects `action(args)`."""
        if self._head is None:
            raise ValueError("Write a checkpoint before requesting an approval: it suspends the thread at one.")
        body = {
            "checkpoint": self._head, "action": action, "args": args, "message": message, "risk": risk,
            "expires_at": expires_at.isoformat() if isinstance(expires_at, datetime) else expires_at,
            "fence": self.fence,
        }  # fmt: skip
        approval = Approval.from_json(self._client.request("POST", f"/threads/{self.id}/approvals/", body))
        self.status = "waiting_for_approval"
        return approval


class Run:
    """A resume job this agent claimed: continue `thread_id` from `checkpoint_id` because of `reason`.

    Hold the lease with `heartbeat()` while working; close with `complete()` or `fail()`.
    """

    def __init__(self, client: Client, data: dict[str, Any]) -> None:
        self._client = client
        self.id: str = data["id"]
        self.thread_id: str = data["thread"]
        self.checkpoint_id: str = data["checkpoint"]
        self.reason: str = data["reason"]
        self.approval = Approval.from_json(data["approval"]) if data.get("approval") else None
        # The trace of the request that queued the run (a decision, say): `serve` continues it.
        self.trace_context: dict[str, str] = data.get("trace_context") or {}
        self._absorb(data)

    def _absorb(self, data: dict[str, Any]) -> None:
        self.status: str = data["status"]
        self.attempts: int = data["attempts"]
        self.fence: str | None = data.get("fence")
        self.lease_expires_at = _time(data["lease_expires_at"])

    def __repr__(self) -> str:
        return f"<Run {self.id} {self.reason} {self.status}>"

    def thread(self) -> Thread:
        """The run's thread, loaded at the checkpoint to resume from; its writes carry this claim's fence."""
        thread = Thread(self._client, self._client.request("GET", f"/threads/{self.thread_id}/"), fence=self.fence)
        thread._move_to(self.checkpoint_id)
        return thread

    def heartbeat(self) -> None:
        """Extend the lease; raises `LeaseLost` when another attempt holds the run now."""
        self._absorb(self._client.request("POST", f"/runs/{self.id}/heartbeat/", {"fence": self.fence})["run"])

    def complete(self) -> None:
        self._absorb(self._client.request("POST", f"/runs/{self.id}/complete/", {"fence": self.fence})["run"])

    def fail(self, error: str = "") -> None:
        body = {"error": error, "fence": self.fence}
        self._absorb(self._client.request("POST", f"/runs/{self.id}/fail/", body)["run"])

    def keeping_lease(self, *, every: float | None = None) -> _LeaseKeeper:
        """A context manager that renews the lease from a side thread (every third of the lease
        left by default) while its block runs; it stops renewing once the lease is lost."""
        return _LeaseKeeper(self, every)


class _LeaseKeeper:
    def __init__(self, run: Run, every: float | None) -> None:
        self.run = run
        self.every = every
        self.stopped = threading.Event()
        self.lost = threading.Event()
        self._thread = threading.Thread(target=self._beat, name=f"quicksave-lease-{run.id}", daemon=True)

    def _interval(self) -> float:
        if self.every is not None:
            return self.every
        if self.run.lease_expires_at is None:
            return 5.0
        left = (self.run.lease_expires_at - datetime.now(self.run.lease_expires_at.tzinfo)).total_seconds()
        return max(0.2, left / 3)

    def _beat(self) -> None:
        while not self.stopped.wait(self._interval()):
            try:
                self.run.heartbeat()
            except LeaseLost:
                self.lost.set()
                return
            except Exception:  # the server may be back by the next beat
                log.warning("heartbeat of run %s failed", self.run.id, exc_info=True)

    def __enter__(self) -> _LeaseKeeper:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopped.set()
        self._thread.join()
