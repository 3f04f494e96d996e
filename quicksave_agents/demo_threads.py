"""The demo's threads: what each is doing now (read from the database, never assumed), and putting
them back as they were first seeded.

A demo thread is any thread of a demo agent: an agent registered in this process whose name starts
with `demo-` (quicksave_agents.demo says why the names are namespaced). `seed_demo` starts them;
`reset_demo` deletes them all, with an audit entry each, and starts them again. Nobody's own
threads are touched: an agent whose name does not start with `demo-` is never a demo agent.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from django.db import transaction
from django.db.models import QuerySet

from approvals.models import ApprovalKind, ApprovalRequest, ApprovalStatus
from audit import trail
from checkpoints import storage
from checkpoints.models import Checkpoint, Thread, ThreadStatus
from quicksave_agents.models import Run, RunStatus

DEMO_PREFIX = "demo-"


class DemoBusy(Exception):
    """A worker is in the middle of a demo thread's step: deleting it now would pull the rug."""


def demo_agent_names() -> list[str]:
    """The names of the demo agents registered in this process (QUICKSAVE_AGENT_MODULES)."""
    from quicksave_agents.worker import load_agent_modules

    return sorted(name for name in load_agent_modules() if name.startswith(DEMO_PREFIX))


def demo_threads() -> QuerySet[Thread]:
    return Thread.objects.filter(agent__name__in=demo_agent_names()).select_related("agent")


@dataclass(frozen=True)
class DemoThread:
    """One demo thread as it stands: its names, and a phrase saying what it is doing."""

    name: str
    agent: str
    doing: str
    pending: int


def describe(threads: QuerySet[Thread]) -> list[DemoThread]:
    """What each thread is doing now, from its status, its pending requests and its runs."""
    rows = []
    for thread in threads.select_related("agent").order_by("agent__name", "created_at"):
        pending = list(
            ApprovalRequest.objects.filter(thread=thread, status=ApprovalStatus.PENDING).order_by("created_at")
        )
        rows.append(DemoThread(name=thread.external_id or str(thread.pk), agent=thread.agent.name,
                               doing=_doing(thread, pending), pending=len(pending)))  # fmt: skip
    return rows


def _doing(thread: Thread, pending: list[ApprovalRequest]) -> str:
    if pending:
        asks = [
            f"is {request.action} done? (in doubt)" if request.kind == ApprovalKind.IN_DOUBT else request.action
            for request in pending
        ]
        return "waits for a person in the inbox: " + ", ".join(asks)
    status = thread.get_status_display().lower()
    if thread.status == ThreadStatus.FAILED and thread.head_id:
        head = Checkpoint.objects.only("step", "metadata").get(pk=thread.head_id)
        error = str((head.metadata or {}).get("error", "")).splitlines()[:1]
        return f"failed at step {head.step}" + (f": {error[0][:80]}" if error else "")
    queued = Run.objects.filter(thread=thread, status=RunStatus.QUEUED).exists()
    if queued and thread.status == ThreadStatus.RUNNING:
        return "queued: the worker drives it once the server runs"
    return status


def reset_refusal() -> str | None:
    """Why the demo cannot be reset right now, or None when it can."""
    busy = Run.objects.filter(thread__in=demo_threads(), status=RunStatus.RUNNING).select_related("thread")
    names = sorted({run.thread.external_id or str(run.thread_id) for run in busy})
    if names:
        return (
            f"A worker is running a step of {', '.join(names)} right now; try again in a few seconds, "
            "or stop the server first (python3 dev.py stop)."
        )
    return None


def count_by_agent() -> dict[str, int]:
    return dict(sorted(Counter(demo_threads().values_list("agent__name", flat=True)).items()))


def delete_demo_threads(*, actor_name: str) -> int:
    """Delete every demo thread with its checkpoints, approvals and runs; one audit entry each.

    Refuses (DemoBusy, nothing deleted) while a worker holds a run of one of them."""
    with transaction.atomic():
        threads = list(demo_threads().select_for_update(of=("self",)).order_by("pk"))
        if refusal := reset_refusal():
            raise DemoBusy(refusal)
        for thread in threads:
            trail.record(
                actor=None, actor_name=actor_name, action="thread.delete", target_type="thread", target_id=thread.pk,
                reason="reset the demo", address=None,
                before={"agent": thread.agent.name, "external_id": thread.external_id, "status": thread.status},
                after={"deleted": True, "data_key": "destroyed"},
            )  # fmt: skip
            storage.delete_thread(thread)
    return len(threads)
