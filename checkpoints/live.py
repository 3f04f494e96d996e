"""Live updates: events go out to websocket groups after their transaction commits.

The Event table is the source of truth; the channel layer only makes delivery fast.
A process hands each committed event to one publisher thread (a queue, so the
writer never waits on Redis), which sends them in order to the thread's group and,
for approvals, to the inbox group: one `live.event` message, or one `live.events`
message carrying the events that queued up while the previous send was under way.
The thread list hears which threads had events at most every THREADS_INTERVAL_SECONDS,
so a busy writer's rounds each cost one send, not two.
An event lost on the way (a process killed, Redis down, a server's channel full) is not
lost to clients: the thread's socket notices the gap in `seq`, or, for a thread's last events,
its server's tail watch notices the thread's counter ahead of it, and replays from the table.
The sockets that receive them are `checkpoints.sockets`; they note in Redis which groups they
listen to (`listening`), so a round skips a group no socket of any process has joined.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import hashlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Collection, Coroutine, Iterable, Sequence
from typing import Any, NamedTuple, TypeVar
from uuid import UUID

import redis
from channels.layers import get_channel_layer
from channels_redis.core import RedisChannelLayer
from django.conf import settings
from django.db import transaction
from django.http import HttpRequest
from opentelemetry.trace import SpanKind

from quicksave import metrics, telemetry

log = logging.getLogger(__name__)
T = TypeVar("T")

INBOX_GROUP = "inbox"
# The thread list's group: the ids of the threads that had events (at most every THREADS_INTERVAL_SECONDS).
THREADS_GROUP = "threads"
_THREAD_GROUP_PREFIX = "thread."
INBOX_TYPES = frozenset({"approval.requested", "approval.voted", "approval.escalated", "approval.decided"})
CHECKPOINT_CREATED = "checkpoint.created"
# At most this many queued events go out in one publisher round. A round costs about one send's time
# however many events and groups it carries (its sends run together), so a publisher that fell
# behind takes its whole backlog in the next round or two rather than a few hundred events a round:
# with 200 a round, a server of 200 busy threads fell behind by ~25 events a second, for good.
BATCH = 5000
# A round waits this long after its first event for more to join it: a writer appending
# hundreds of checkpoints a second then costs the publisher (and the GIL it shares with the
# writer) one round per few events, for a delay no one watching a page can see.
LINGER_SECONDS = 0.005
# The thread list's `live.threads` goes out at most this often, naming every thread that had events
# since the last one; the first change after a quiet spell goes out with its round. The page refetches
# itself at most once a second anyway (static/js/threads.js), and channels-redis' group_send is two
# Redis round trips of the publisher's time (and the GIL's) whether or not anyone listens.
THREADS_INTERVAL_SECONDS = 0.5
# A send handed to the server's event loop that has not finished after this long is logged (once) and
# waited on still: it is under way, and the next round's send must not overtake it.
SLOW_SEND_SECONDS = 5.0


# A payload key that marks a queued item as a channel message to send as it is, not an event.
_AS_IS = "__message__"


def thread_group(thread_id: UUID | str) -> str:
    return f"{_THREAD_GROUP_PREFIX}{thread_id}"


def agent_key_group(key_id: int) -> str:
    """The group of the sockets opened with one agent key."""
    return f"agentkey.{key_id}"


def session_group(session_key: str) -> str:
    """The group of the sockets opened by one browser session."""
    # Redis sees a digest: the session key itself would let anyone who can read Redis sign in.
    return f"session.{hashlib.sha256(session_key.encode()).hexdigest()[:32]}"


def message(*, thread_id: UUID | str, seq: int, type: str, data: dict[str, Any]) -> dict[str, Any]:
    """An event as websocket clients receive it (PRODUCT.md's shape)."""
    return {"type": type, "seq": seq, "thread": str(thread_id), "data": data}


class Outage:
    """Logs that something went away once, and once that it is back, instead of once per socket."""

    def __init__(self, what: str, consequence: str) -> None:
        self.what, self.consequence = what, consequence
        self.down = False
        self._lock = threading.Lock()  # the publisher thread reports too

    def began(self, error: BaseException) -> None:
        with self._lock:
            first, self.down = not self.down, True
        if first:
            log.error("%s failed (%s: %s): %s", self.what, type(error).__name__, error, self.consequence)

    def ended(self) -> None:
        with self._lock:
            was_down, self.down = self.down, False
        if was_down:
            log.warning("%s works again", self.what)


layer_outage = Outage(
    "The channel layer (Redis)",
    "websockets are refused (4503) and live events wait in the Event table until it is back",
)


_server_loop: asyncio.AbstractEventLoop | None = None


def register_server_loop(loop: asyncio.AbstractEventLoop) -> None:
    """Remember the ASGI server's event loop (consumers call this when they connect).

    The in-memory channel layer's queues belong to that loop, so events are sent from it;
    channels-redis works from any loop, and a process without websockets has none.
    """
    global _server_loop
    _server_loop = loop


class _Queued(NamedTuple):
    """An item on the publisher's queue: a message for `group`, when it was committed (for the
    publish lag) and the trace context of the write that made it (empty without tracing). A tuple:
    the frozen dataclass it was cost the writer 7,900 instructions an event to make, this 3,400."""

    group: str
    payload: dict[str, Any]
    committed: float
    trace: dict[str, str]


class _Publisher:
    """One thread per process that sends queued events, in order."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[_Queued] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        # Threads that had events since the thread list's last message, and when the next may go.
        self._changed: set[str] = set()
        self._threads_due = 0.0

    def send(self, group: str, payload: dict[str, Any], *, trace: dict[str, str] | None = None) -> None:
        self._ensure_started()
        self._queue.put(_Queued(group, payload, time.monotonic(), trace or {}))

    def flush(self, timeout: float = 5.0) -> None:
        """Wait until everything queued so far has been sent (tests use it)."""
        done = threading.Event()
        self.send("", {"__flush__": done})
        done.wait(timeout)

    def _ensure_started(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="live-publisher", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        own_loop = asyncio.new_event_loop()
        while True:
            # Whatever queued up while the last send was on its way goes out together: one
            # message per group instead of one per event, so a busy writer costs the
            # publisher (and the GIL it shares with the writer) a send per batch.
            batches: dict[str, list[_Queued]] = {}
            for item in self._drain():
                if _AS_IS in item.payload:
                    self._send(get_channel_layer(), {item.group: item.payload[_AS_IS]}, own_loop)
                    continue
                flushed = item.payload.get("__flush__")
                if flushed is None:
                    batches.setdefault(item.group, []).append(item)
                    continue
                self._send_all(batches, own_loop, flushing=True)
                batches = {}
                flushed.set()
            self._send_all(batches, own_loop)

    def _drain(self) -> list[_Queued]:
        """The next queued item, then up to BATCH - 1 more queued by the end of the linger; nothing
        when the thread list's message falls due first."""
        wait = max(0.0, self._threads_due - time.monotonic()) if self._changed else None
        try:
            items = [self._queue.get(timeout=wait)]
        except queue.Empty:
            return []
        time.sleep(LINGER_SECONDS)
        try:
            while len(items) < BATCH:
                items.append(self._queue.get_nowait())
        except queue.Empty:
            pass
        return items

    def _send_all(
        self, batches: dict[str, list[_Queued]], own_loop: asyncio.AbstractEventLoop, *, flushing: bool = False
    ) -> None:
        """Send a round's messages, one per group, then the thread list's if it is due (or flushing):
        all of them at once, in one trip to the server's loop, so a round costs about one send's time
        however many groups it has."""
        layer = get_channel_layer() if batches or self._changed else None
        if layer is None:
            return
        messages: dict[str, dict[str, Any]] = {}
        for group, items in batches.items():
            events = [item.payload for item in items]
            messages[group] = (
                {"type": "live.event", "event": events[0]}
                if len(events) == 1
                else {"type": "live.events", "events": events}
            )
        self._changed.update(
            items[0].payload["thread"] for group, items in batches.items() if group.startswith(_THREAD_GROUP_PREFIX)
        )
        now = time.monotonic()
        if self._changed and (flushing or now >= self._threads_due):
            # One message tells the thread list which of its rows may have changed since the last.
            changed, self._changed = sorted(self._changed), set()
            self._threads_due = now + THREADS_INTERVAL_SECONDS
            messages[THREADS_GROUP] = {"type": "live.threads", "threads": changed}
        traces = [item.trace for items in batches.values() for item in items if item.trace]
        queued = sum(map(len, batches.values()))
        with telemetry.span("quicksave.live.publish", carrier=traces[0] if traces else None, links=traces[1:],
                            kind=SpanKind.PRODUCER, attributes={"quicksave.events": queued}):  # fmt: skip
            if traces:
                # The sockets' server process continues the trace under this send (EventConsumer.dispatch).
                carrier = telemetry.current_carrier()
                for group in batches:
                    messages[group]["trace"] = carrier
            sent = self._send(layer, messages, own_loop)
        now = time.monotonic()
        for group, items in batches.items():
            if group in sent:
                for item in items:
                    metrics.live_publish_lag_seconds.observe(now - item.committed)

    @staticmethod
    def _send(layer: Any, messages: dict[str, dict[str, Any]], own_loop: asyncio.AbstractEventLoop) -> set[str]:
        """Send each group its message, concurrently; the groups whose send did not fail (logged,
        counted). A group no socket listens to is not sent to, and counts as sent."""
        if layer is None or not messages:
            return set()
        heard = _listened(layer, list(messages))
        groups = [group for group in messages if group in heard]
        results: list[BaseException | None] = []
        if groups:
            sends = _gather(layer.group_send(group, messages[group]) for group in groups)
            try:
                server_loop = _server_loop
                if server_loop is not None and server_loop.is_running():
                    results = _wait_for(asyncio.run_coroutine_threadsafe(sends, server_loop), server_loop, groups)
                else:
                    results = own_loop.run_until_complete(sends)
            except Exception as stopped:  # the server's loop stopped under the sends
                results = [stopped] * len(groups)
        failed: set[str] = set()
        for group, error in zip(groups, results, strict=True):
            if error is None:
                continue
            failed.add(group)
            metrics.live_publish_failures_total.inc()
            if isinstance(error, redis.RedisError):  # Redis down: clients catch up from the Event table
                layer_outage.began(error)
            else:
                log.warning("could not publish to %s", group, exc_info=error)
        if groups and len(failed) < len(groups):
            layer_outage.ended()
        return set(messages) - failed


async def _gather(sends: Iterable[Coroutine[Any, Any, None]]) -> list[BaseException | None]:
    """Run the sends together; each one's exception, or None."""
    results = await asyncio.gather(*sends, return_exceptions=True)
    return [result if isinstance(result, BaseException) else None for result in results]


def _wait_for(sent: concurrent.futures.Future[T], loop: asyncio.AbstractEventLoop, groups: Sequence[str]) -> T:
    """Wait for a send the server's loop runs, however busy that loop is, unless it stops running.

    A loop that takes longer than SLOW_SEND_SECONDS (a server short of CPU) is not a failed send:
    giving up would log an error for a message that still goes out, and let the next overtake it.
    """
    try:
        return sent.result(timeout=SLOW_SEND_SECONDS)
    except TimeoutError:
        named = ", ".join(groups[:3]) + (f" and {len(groups) - 3} more groups" if len(groups) > 3 else "")
        log.warning("the server's event loop has not sent to %s in %.0f s; waiting for it", named, SLOW_SEND_SECONDS)
    while True:
        try:
            return sent.result(timeout=SLOW_SEND_SECONDS)
        except TimeoutError:
            if not loop.is_running():
                sent.cancel()
                raise


# Which groups a socket of some server process listens to. channels-redis keeps each group's members
# in Redis but offers no public way to read them, and its group_send costs two round trips and a run
# of the publisher's event loop whether or not anyone listens (0.2 M instructions of the writer's
# process a round: the same GIL). So the sockets note their groups beside it, in a sorted set per
# group of the channels that joined, scored by when: one ZCOUNT tells the publisher whether to send.
# A member older than the layer's group_expiry counts no more, as channels-redis forgets it then too;
# one a killed process left behind costs only sends, as before. A socket notes its groups before it
# replays the table, so an event the publisher skipped is one its replay reads.
_LISTENING_PREFIX = "quicksave:listening:"


@functools.cache
def _listening_redis(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)


def _listening_key(group: str) -> str:
    return f"{_LISTENING_PREFIX}{group}"


def _registry_in_use(layer: Any) -> bool:
    """Whether sockets note their groups: with channels-redis on REDIS_URL (settings), not with the
    in-memory layer of a single process, whose sends cost next to nothing."""
    return isinstance(layer, RedisChannelLayer) and bool(settings.REDIS_URL)


def listening(groups: Collection[str], channel: str, *, layer: Any) -> None:
    """Note that `channel` (a socket) listens to `groups` (after joining them in the layer)."""
    if not groups or not _registry_in_use(layer):
        return
    now = time.time()
    with _listening_redis(settings.REDIS_URL).pipeline(transaction=False) as pipe:
        for group in groups:
            pipe.zadd(_listening_key(group), {channel: now})
            pipe.expire(_listening_key(group), layer.group_expiry)
        pipe.execute()


def not_listening(groups: Collection[str], channel: str, *, layer: Any) -> None:
    """Note that `channel` left `groups`."""
    if not groups or not _registry_in_use(layer):
        return
    with _listening_redis(settings.REDIS_URL).pipeline(transaction=False) as pipe:
        for group in groups:
            pipe.zrem(_listening_key(group), channel)
        pipe.execute()


def _listened(layer: Any, groups: Sequence[str]) -> set[str]:
    """Which of `groups` some socket listens to, asked in one round trip; any doubt (another layer,
    Redis failing) says all of them."""
    if not _registry_in_use(layer):
        return set(groups)
    since = time.time() - layer.group_expiry
    try:
        with _listening_redis(settings.REDIS_URL).pipeline(transaction=False) as pipe:
            for group in groups:
                pipe.zcount(_listening_key(group), since, "+inf")
            counts = pipe.execute()
    except redis.RedisError:
        return set(groups)
    return {group for group, count in zip(groups, counts, strict=True) if count}


_publisher = _Publisher()


def publish_on_commit(
    *, thread_id: UUID | str, seq: int, type: str, data: dict[str, Any], agent: str | None = None
) -> None:
    """Send the event to its websocket groups once the current transaction commits."""
    # The writer's trace context, taken now: the commit may run its callbacks under another span.
    transaction.on_commit(functools.partial(publish, thread_id=thread_id, seq=seq, type=type, data=data, agent=agent,
                                            trace=telemetry.current_carrier()))  # fmt: skip


def publish(
    *,
    thread_id: UUID | str,
    seq: int,
    type: str,
    data: dict[str, Any],
    agent: str | None = None,
    trace: dict[str, str] | None = None,
) -> None:
    """Send a committed event to its websocket groups (publish_on_commit waits for the commit)."""
    if type == CHECKPOINT_CREATED:
        metrics.checkpoint_writes_total.inc()
    payload = message(thread_id=thread_id, seq=seq, type=type, data=data)
    # The thread's id as text once: UUID.__str__ is Python code.
    _publisher.send(thread_group(payload["thread"]), payload, trace=trace)
    if type in INBOX_TYPES:
        _publisher.send(INBOX_GROUP, {**payload, "agent": agent}, trace=trace)
    for listener in _listeners:
        try:
            listener(payload)
        except Exception:  # a listener's fault is not the writer's: its commit stands
            log.warning("a listener of committed events failed", exc_info=True)


# Who else hears of each committed event (the GenAI export, checkpoints.genai_live): called in the
# writer's thread just after its commit, so a listener only queues the event for a thread of its own.
_listeners: list[Callable[[dict[str, Any]], None]] = []


def listen(listener: Callable[[dict[str, Any]], None]) -> None:
    """Call `listener(event)` with every event this process commits (once per listener)."""
    if listener not in _listeners:
        _listeners.append(listener)


def send_on_commit(group: str, payload: dict[str, Any]) -> None:
    """Once the current transaction commits, send an event of another feed (a memory board's) to
    `group` through this process's publisher, in order with the rest; its consumers'
    `live_event` receive it as they receive a thread's."""
    transaction.on_commit(functools.partial(_publisher.send, group, payload, trace=telemetry.current_carrier()))


def send(group: str, payload: dict[str, Any]) -> None:
    """Send an event of another feed to `group` through this process's publisher now: what it
    tells of is committed already (send_on_commit waits for that)."""
    _publisher.send(group, payload, trace=telemetry.current_carrier())


def close_sockets_on_commit(group: str) -> None:
    """Once the current transaction commits, close the sockets in `group` (agent_key_group,
    session_group) with 4401 on every server process. A process that misses the message closes
    them at its next re-check of their sign-ins."""
    transaction.on_commit(functools.partial(_publisher.send, group, {_AS_IS: {"type": "sign_in.ended"}}))


def close_session_sockets(sender: Any, request: HttpRequest | None = None, **kwargs: Any) -> None:
    """On `user_logged_out`: close the sockets the signed-out browser session opened."""
    session_key = getattr(getattr(request, "session", None), "session_key", None)
    if session_key:
        close_sockets_on_commit(session_group(session_key))


def flush(timeout: float = 5.0) -> None:
    _publisher.flush(timeout)
