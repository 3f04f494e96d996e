"""The runtime for in-process agents: step, checkpoint, repeat; suspend for approval; resume.

An agent is a state machine. `step(ctx)` reads and changes `ctx.state` and returns
what happened (`Continue`, `Done`, `Fail`); the runtime commits a checkpoint after
every step before it starts the next, so a crash loses at most the step in flight.
Side effects go through `ctx.tool(...)`, which logs an intent before the call and its
result after (quicksave_agents.tool_calls): a step replayed after a crash gets the recorded result
instead of repeating the call, and a call that may have run without a recorded result
goes to a person instead of running again (unless the tool is idempotent).

`ctx.request_approval(...)` checkpoints the thread as waiting for approval and ends
the run. When a person decides, a run resumes the agent from that checkpoint; the
step runs again, and this time the same call returns the decision — only if it is the
very call the decision was made on.

Every write a run makes carries its fence (quicksave_agents.fencing), and the runtime checks the
lease before each step and each tool call: an attempt that lost its run stops.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar
from uuid import UUID

from django.db import transaction

from approvals.models import ApprovalKind, ApprovalRequest, ApprovalStatus
from checkpoints import storage
from checkpoints.models import Checkpoint, CheckpointStatus, Thread, ThreadStatus
from checkpoints.storage.errors import StaleParent
from checkpoints.storage.tool_results import tool_key
from quicksave_agents import tool_calls
from quicksave_agents.fencing import Fence, LeaseLost
from quicksave_agents.keys import get_or_create_agent
from quicksave_agents.models import Run, RunReason, ToolCall
from quicksave_agents.runs import enqueue_run

log = logging.getLogger(__name__)

Upcaster = Callable[[dict[str, Any]], dict[str, Any]]


@dataclass(frozen=True)
class Continue:
    """The step finished; checkpoint and run the next one."""

    label: str


@dataclass(frozen=True)
class Done:
    label: str = "done"


@dataclass(frozen=True)
class Fail:
    """The agent gives up: the thread is marked failed at this checkpoint (`metadata` is recorded
    beside the reason)."""

    reason: str
    label: str = "failed"
    metadata: dict[str, Any] = field(default_factory=dict)


StepResult = Continue | Done | Fail


@dataclass(frozen=True)
class Decision:
    """What a person decided on an approval the agent requested."""

    approved: bool
    args: Any
    comment: str
    edited: bool
    decided_by: str | None
    expired: bool = False


class Suspend(Exception):
    """Raised by ctx.request_approval to end the run while a person decides."""


class ApprovalMismatch(Exception):
    """A resumed step asked for something other than the call its decision was made on."""


class Agent:
    """Base class of an in-process agent. Subclasses set `name` and implement `step`.

    Bump `schema_version` when the shape of the state changes, and register an
    upcaster from each older version so a thread written by an older agent resumes.
    """

    name: ClassVar[str]
    version: ClassVar[str] = "1"
    schema_version: ClassVar[int] = 1
    upcasters: ClassVar[dict[int, Upcaster]] = {}
    action_schemas: ClassVar[dict[str, dict[str, Any]]] = {}

    def initial_state(self, **inputs: Any) -> dict[str, Any]:
        return dict(inputs)

    def step(self, ctx: Context) -> StepResult:
        raise NotImplementedError

    def verify_environment(self, references: list[dict[str, str]]) -> list[str]:
        """Before a fork resumes: what of the environment the checkpoint recorded
        (`metadata.environment`: `kind`, `locator`, `digest` each) no longer matches, one sentence
        each; any answer stops the resume. Checks nothing by default; `quicksave_sdk.environment.
        check_local` checks git checkouts and files on this machine."""
        return []

    def upcast(self, state: dict[str, Any], from_version: int) -> dict[str, Any]:
        """Bring a state written at `from_version` up to this agent's schema_version."""
        for version in range(from_version, self.schema_version):
            upcaster = self.upcasters.get(version)
            if upcaster is None:
                raise RuntimeError(f"{self.name} has no upcaster from schema version {version} to {version + 1}")
            state = upcaster(state)
        return state


class LoopAgent(Agent):
    """An agent that runs its own loop and writes its own checkpoints (a LangGraph graph):
    the runtime hands it the whole run instead of stepping it."""

    def drive(self, run: Run, thread: Thread, *, lease_held: Callable[[], bool]) -> str:
        """Carry the run out, writing with the run's fence (`Fence(run.pk, run.attempts)`) and asking
        `lease_held` before each step; return what `execute` does."""
        raise NotImplementedError


_registry: dict[str, type[Agent]] = {}


def register(agent_class: type[Agent]) -> type[Agent]:
    """Class decorator: make an agent runnable by the worker under its `name`."""
    _registry[agent_class.name] = agent_class
    return agent_class


def registered() -> dict[str, type[Agent]]:
    return dict(_registry)


@dataclass
class Context:
    """What a step sees: the thread, its state, the tool-call log and any pending decision."""

    thread: Thread
    agent: Agent
    head: UUID
    state: dict[str, Any]
    step_number: int
    decision: Decision | None = None
    # The run's claim, and whether it still holds its lease (a worker's heartbeat says).
    fence: Fence | None = None
    lease_held: Callable[[], bool] = field(default=lambda: True, repr=False)
    # The environment the state depends on (`kind`, `locator`, `digest` each: a git commit, an
    # image digest...), recorded on every checkpoint committed from now on; a fork resumed from
    # one of them checks it first (Agent.verify_environment).
    environment: list[dict[str, str]] | None = None
    # The call the decision was made on: (action, digest of [action, args]).
    _decided_call: tuple[str, str] | None = field(default=None, repr=False)
    # The checkpoint the step in flight started from, and how many calls it has made: together
    # they key each call, the same way on every replay of the step.
    _step_base: UUID | None = field(default=None, repr=False)
    _calls: int = field(default=0, repr=False)

    def tool(self, name: str, args: Any, fn: Callable[..., Any], *, idempotent: bool = False) -> Any:
        """Call `fn(args)` at most once for this step (see quicksave_agents.tool_calls); a replay gets the first result.

        The intent is committed before `fn` runs and the result after. When `fn` takes an
        `idempotency_key` argument it gets the call's key, the same on every replay: pass it to an
        API that deduplicates on it. `idempotent=True` says running `fn` twice with that key does
        no harm, so a replay that cannot tell whether it ran runs it again; any other call in that
        state stops the run and waits for a person.
        """
        self.check_lease()
        key = tool_calls.call_key(thread_id=self.thread.pk, checkpoint_id=self._step_base, position=self._calls)
        self._calls += 1
        begun = tool_calls.begin(thread_id=self.thread.pk, key=key, tool=name, args=args, idempotent=idempotent,
                                 fence=self.fence)  # fmt: skip
        if begun.outcome is tool_calls.Outcome.DONE:
            return begun.call.result
        if begun.outcome is tool_calls.Outcome.IN_DOUBT:
            raise _InDoubt(begun.call)
        result = fn(args, idempotency_key=key) if _takes_key(fn) else fn(args)
        return tool_calls.finish(thread_id=self.thread.pk, key=key, result=result, fence=self.fence)

    def check_lease(self) -> None:
        """Raise LeaseLost when this run's attempt no longer holds its lease."""
        if self.fence is not None and not self.lease_held():
            raise self.fence.lost(thread_id=self.thread.pk)

    def request_approval(self, action: str, args: Any, message: str = "") -> Decision:
        """Return the decision on `action(args)` if one was made; otherwise suspend until a person decides.

        A step resumed by a decision must ask for the very call the decision was made on (the
        same action and arguments): anything else raises ApprovalMismatch, and the thread fails
        instead of acting on a decision nobody made.
        """
        if self.decision is not None and self._decided_call is not None:
            asked = (action, tool_key(action, args))
            if asked != self._decided_call:
                raise ApprovalMismatch(
                    f"The resumed step asked to approve {action} with arguments (digest {asked[1][:12]}), but the "
                    f"decision was made on {self._decided_call[0]} (digest {self._decided_call[1][:12]}); "
                    "not acting on it."
                )
            decision, self.decision, self._decided_call = self.decision, None, None
            return decision
        raise _ApprovalNeeded(action=action, args=args, message=message)

    def _begin_step(self) -> None:
        self.check_lease()
        self._step_base, self._calls = self.head, 0


def _takes_key(fn: Callable[..., Any]) -> bool:
    try:
        parameters = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a builtin without a signature
        return False
    return "idempotency_key" in parameters or any(p.kind is p.VAR_KEYWORD for p in parameters.values())


class _InDoubt(Suspend):
    def __init__(self, call: ToolCall) -> None:
        super().__init__(call.tool)
        self.call = call


class _ApprovalNeeded(Suspend):
    def __init__(self, *, action: str, args: Any, message: str) -> None:
        super().__init__(action)
        self.action = action
        self.action_args = args  # not `args`: Exception.args would turn it into a tuple
        self.message = message


def start_thread(*, agent_class: type[Agent], external_id: str | None = None, **inputs: Any) -> Thread:
    """Create a thread for an agent with its first checkpoint, and queue the run that drives it."""
    agent = agent_class()
    record = get_or_create_agent(name=agent_class.name, version=agent_class.version)
    if record.action_schemas != agent_class.action_schemas:
        record.action_schemas = agent_class.action_schemas
        record.save(update_fields=["action_schemas"])
    with transaction.atomic():
        thread, created = storage.create_thread(agent=record, external_id=external_id, metadata={"inputs": inputs})
        if not created:
            return thread
        first = storage.append_checkpoint(thread=thread, parent=None, state=agent.initial_state(**inputs), step=0,
                                        label="start", schema_version=agent_class.schema_version)  # fmt: skip
        enqueue_run(thread=thread, checkpoint=first, reason=RunReason.START)
    return thread


def execute(run: Run, *, max_steps: int = 1000, lease_held: Callable[[], bool] | None = None) -> str:
    """Drive the run's agent from the run's checkpoint until it finishes, fails or suspends.

    Returns what happened: "done", "failed", "suspended" (waiting for a person: an approval or
    a call in doubt), "stale" (someone else moved the branch on: this run is obsolete),
    "cancelled" (the thread was cancelled meanwhile) or "lease_lost" (another attempt holds
    the run now: this one stopped, and wrote nothing after it lost the run). `lease_held` says
    whether the worker still holds the run's lease; it is asked before each step and tool call.
    """
    thread = Thread.objects.select_related("agent").get(pk=run.thread_id)
    agent_class = _registry.get(thread.agent.name)
    if agent_class is None:
        raise RuntimeError(f"No in-process agent is registered as {thread.agent.name!r}")
    agent = agent_class()
    fence = Fence(run.pk, run.attempts)
    if isinstance(agent, LoopAgent):
        try:
            return agent.drive(run, thread, lease_held=lease_held or (lambda: True))
        except LeaseLost:
            log.warning("run %s: attempt %s lost its lease; it stops here", run.pk, run.attempts)
            return "lease_lost"
    start = Checkpoint.objects.defer("payload").get(pk=run.checkpoint_id)
    if run.attempts > 1:
        # An earlier attempt died holding this run after checkpointing past the run's
        # checkpoint: go on from the last checkpoint it committed, instead of replaying
        # from the start onto a parent that is no longer the head.
        latest = (
            Checkpoint.objects.defer("payload")
            .filter(thread_id=thread.pk, branch_id=start.branch_id, seq__gt=start.seq)
            .order_by("-seq")
            .first()
        )
        if latest is not None:
            start = latest
            finished = _FINISHED.get(latest.status)
            if finished is not None:
                return finished
    state = agent.upcast(storage.state_at(start, hot=True), start.schema_version)
    ctx = Context(thread=thread, agent=agent, head=start.pk, state=state, step_number=start.step or 0, fence=fence,
                  lease_held=lease_held or (lambda: True),
                  environment=list(start.metadata.get("environment", [])) or None)  # fmt: skip
    if run.reason == RunReason.FORK and start.pk == run.checkpoint_id:
        changed = agent.verify_environment(list(start.metadata.get("environment", [])))
        if changed:
            return _refuse(ctx, run, environment_changed(start.pk, changed), metadata={"environment_mismatch": changed})
    # The step a decision resumes began at the checkpoint before the one that waited for it:
    # its calls keep the keys they had when it first ran.
    waited = start.status == CheckpointStatus.WAITING_FOR_APPROVAL
    resumed_from = start.parent_id if waited else start.pk
    approval = None
    if run.approval_id and start.pk == run.checkpoint_id:
        approval = ApprovalRequest.objects.select_related("decided_by").get(pk=run.approval_id)
        # A fork may carry a decision to its new branch: an admin bound it there on purpose.
        if (
            approval.kind == ApprovalKind.APPROVAL
            and run.reason == RunReason.APPROVAL
            and approval.checkpoint_id != start.pk
        ):
            return _refuse(ctx, run, f"Run {run.pk} resumes checkpoint {start.pk}, but its decision was made "
                                     f"at checkpoint {approval.checkpoint_id}; not acting on it.")  # fmt: skip
    if waited and (approval is None or approval.kind != ApprovalKind.APPROVAL):
        # Resuming a step that a decision had resumed before (a call in it was then in doubt, or
        # its attempt died): it gets the decision made at this checkpoint again.
        approval = _decision_at(start)
    if approval is not None and approval.kind == ApprovalKind.APPROVAL:
        ctx.decision = decision_for(approval)
        ctx._decided_call = (approval.action, tool_key(approval.action, approval.args))

    try:
        for number in range(max_steps):
            ctx._begin_step()
            if number == 0:
                ctx._step_base = resumed_from
            try:
                result = agent.step(ctx)
                if ctx.decision is not None:
                    raise ApprovalMismatch(
                        f"The resumed step did not ask for {ctx._decided_call[0] if ctx._decided_call else 'it'}, "
                        "the call its decision was made on; not going on without it."
                    )
            except _ApprovalNeeded as needed:
                _suspend(ctx, needed)
                return "suspended"
            except _InDoubt as doubt:
                from approvals.services import ThreadCancelled, file_in_doubt

                try:
                    file_in_doubt(call=doubt.call, checkpoint=Checkpoint.objects.defer("payload").get(pk=ctx.head),
                                  fence=fence)  # fmt: skip
                except ThreadCancelled:
                    log.info("run %s stops: thread %s was cancelled", run.pk, thread.pk)
                    return "cancelled"
                log.warning("run %s stops: call %s (%s) is in doubt", run.pk, doubt.call.key[:12], doubt.call.tool)
                return "suspended"
            except LeaseLost:
                raise
            except (Exception, SystemExit) as exc:  # a tool calling sys.exit() fails its step, not the worker
                log.exception("agent %s failed in thread %s", agent.name, thread.pk)
                result = Fail(reason=f"{type(exc).__name__}: {exc}")
            if Thread.objects.filter(pk=thread.pk, status=ThreadStatus.CANCELLED).exists():
                # An admin cancelled the thread during this step: its result is not committed.
                log.info("run %s stops: thread %s was cancelled", run.pk, thread.pk)
                return "cancelled"
            try:
                _commit(ctx, result)
            except StaleParent:
                log.warning("run %s is stale: thread %s moved on past %s", run.pk, thread.pk, ctx.head)
                return "stale"
            if isinstance(result, Done):
                return "done"
            if isinstance(result, Fail):
                return "failed"
    except LeaseLost:
        log.warning("run %s: attempt %s lost its lease; it stops here", run.pk, run.attempts)
        return "lease_lost"
    raise RuntimeError(f"{agent.name} did not finish within {max_steps} steps")


def _decision_at(checkpoint: Checkpoint) -> ApprovalRequest | None:
    """The decided approval that a checkpoint waited for, if it was decided."""
    return (
        ApprovalRequest.objects.select_related("decided_by")
        .filter(
            checkpoint=checkpoint,
            kind=ApprovalKind.APPROVAL,
            status__in=[ApprovalStatus.APPROVED, ApprovalStatus.REJECTED, ApprovalStatus.EXPIRED],
        )
        .order_by("-decided_at")
        .first()
    )


def environment_changed(checkpoint_id: UUID | str, changed: list[str]) -> str:
    """Why a resume from a fork stopped: the world no longer matches what its checkpoint recorded."""
    return (
        f"The environment changed since checkpoint {checkpoint_id} was written: {'; '.join(changed)}. "
        "Not resuming on a changed world: restore it, or fork from a checkpoint that matches it."
    )


def _refuse(ctx: Context, run: Run, reason: str, *, metadata: dict[str, Any] | None = None) -> str:
    """Fail the thread at its head with `reason` instead of resuming it."""
    log.error("run %s: %s", run.pk, reason)
    try:
        _commit(ctx, Fail(reason=reason, metadata=metadata or {}))
    except (StaleParent, LeaseLost):
        return "stale"
    return "failed"


# A checkpoint with one of these statuses ended its run: a retried run stops there.
_FINISHED: dict[str, str] = {
    CheckpointStatus.COMPLETED: "done",
    CheckpointStatus.FAILED: "failed",
    CheckpointStatus.WAITING_FOR_APPROVAL: "suspended",
}


def _commit(ctx: Context, result: StepResult) -> None:
    """Checkpoint the state the step left behind."""
    ctx.step_number += 1
    status = CheckpointStatus.RUNNING
    metadata: dict[str, Any] = {}
    if isinstance(result, Done):
        status = CheckpointStatus.COMPLETED
    elif isinstance(result, Fail):
        status = CheckpointStatus.FAILED
        metadata = {**result.metadata, "error": result.reason[:2000]}
    if ctx.environment:
        metadata["environment"] = ctx.environment
    checkpoint = storage.append_checkpoint(
        thread=ctx.thread, parent=ctx.head, state=ctx.state, step=ctx.step_number, label=result.label,
        status=status, metadata=metadata, schema_version=ctx.agent.schema_version, fence=ctx.fence,
    )  # fmt: skip
    ctx.head = checkpoint.pk


def _suspend(ctx: Context, needed: _ApprovalNeeded) -> None:
    """Checkpoint as waiting for approval and file the request, in one transaction."""
    from approvals.services import request_approval

    with transaction.atomic():
        ctx.step_number += 1
        checkpoint = storage.append_checkpoint(
            thread=ctx.thread, parent=ctx.head, state=ctx.state, step=ctx.step_number,
            label=f"approval: {needed.action}", status=CheckpointStatus.WAITING_FOR_APPROVAL,
            schema_version=ctx.agent.schema_version, fence=ctx.fence,
        )  # fmt: skip
        request_approval(thread=ctx.thread, checkpoint=checkpoint, action=needed.action, args=needed.action_args,
                         message=needed.message, fence=ctx.fence)  # fmt: skip
    ctx.head = checkpoint.pk


def decision_for(approval: ApprovalRequest) -> Decision:
    """What a person (or the expiry) decided on an approval that is no longer pending."""
    approved = approval.status == ApprovalStatus.APPROVED or (
        approval.status == ApprovalStatus.EXPIRED and approval.decided_args is not None
    )
    return Decision(
        approved=approved,
        args=approval.decided_args if approved else None,
        comment=approval.comment,
        edited=approval.args_edited,
        decided_by=approval.decided_by.get_username() if approval.decided_by else None,
        expired=approval.status == ApprovalStatus.EXPIRED,
    )
