"""Who may read and write which threads: the one place API views and pages ask."""

from __future__ import annotations

from typing import Any, TypeVar

from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied as Forbidden
from django.db.models import Model, QuerySet
from django.http import Http404
from rest_framework.exceptions import PermissionDenied

from checkpoints.models import Checkpoint, Thread
from checkpoints.storage.lru import LRU
from quicksave_agents.auth import AgentPrincipal

M = TypeVar("M", bound=Model)


def visible_threads(principal: Any) -> QuerySet[Thread]:
    """Threads the caller may read: an agent key sees its own agent's threads only."""
    threads = Thread.objects.all()
    if isinstance(principal, AgentPrincipal):
        return threads.filter(agent_id=principal.agent.pk)
    if _reads_every_thread(principal):
        return threads
    return threads.none()


def of_visible_threads(rows: QuerySet[M], principal: Any, *, thread: str = "thread") -> QuerySet[M]:
    """`rows` of the threads the caller may read (as `visible_threads`), through their foreign key
    `thread`. For a person who may read every thread, `rows` as they are: `thread__in=` every
    thread would join the whole thread table in each query for nothing."""
    if isinstance(principal, AgentPrincipal):
        return rows.filter(**{f"{thread}__agent_id": principal.agent.pk})
    if _reads_every_thread(principal):
        return rows
    return rows.none()


def _reads_every_thread(principal: Any) -> bool:
    return bool(getattr(principal, "is_authenticated", False) and principal.has_perm("checkpoints.view_thread"))


def get_thread_for(principal: Any, thread_id: Any) -> Thread:
    """The thread if the caller may read it; a foreign thread is a 404, as if it did not exist."""
    thread = visible_threads(principal).select_related("agent").filter(pk=thread_id).first()
    if thread is None:
        raise Http404(f"Thread {thread_id} does not exist.")
    return thread


def get_checkpoint_for(principal: Any, checkpoint_id: Any) -> Checkpoint:
    checkpoint = (
        Checkpoint.objects.defer("payload")
        .select_related("branch")
        .filter(pk=checkpoint_id, thread__in=visible_threads(principal))
        .first()
    )
    if checkpoint is None:
        raise Http404(f"Checkpoint {checkpoint_id} does not exist.")
    return checkpoint


# A thread's agent never changes, so which agent owns a thread is remembered per
# process: an agent writing a checkpoint then costs no lookup before the write.
_owners: LRU[Any, int] = LRU(100_000)


def thread_for_write(principal: Any, thread_id: Any) -> Thread:
    """The thread to write to, if the caller may write it (raises 404/403 otherwise)."""
    if isinstance(principal, AgentPrincipal):
        owner = _owners.get(thread_id)
        if owner is None:
            owner = Thread.objects.filter(pk=thread_id).values_list("agent_id", flat=True).first()
            if owner is None:
                raise Http404(f"Thread {thread_id} does not exist.")
            _owners.remember(thread_id, owner)  # not a thread a rollback is about to take back
        thread = Thread(pk=thread_id, agent_id=owner)
    else:
        thread = get_thread_for(principal, thread_id)
    check_can_write(principal, thread)
    return thread


def check_can_write(principal: Any, thread: Thread) -> None:
    """Agents write their own threads; people need the add_checkpoint permission (admins)."""
    if isinstance(principal, AgentPrincipal):
        if principal.agent.pk != thread.agent_id:
            raise Http404(f"Thread {thread.pk} does not exist.")
        return
    if not principal.has_perm("checkpoints.add_checkpoint"):
        raise PermissionDenied("Writing checkpoints needs an agent key or the admin role.")


def check_can_fork(principal: Any) -> User:
    """The person who may rewind, edit and branch threads (the admin role); 403 for anyone else.

    Raises Django's PermissionDenied, which both the API (its error format) and the
    dashboard (the 403 page) turn into a 403. Agent keys never fork: a fork is a human decision.
    """
    if not isinstance(principal, User) or not principal.has_perm("checkpoints.fork_thread"):
        raise Forbidden("Rewinding and branching a thread needs the admin role.")
    return principal


def check_can_cancel(principal: Any) -> User:
    """The person who may cancel or resume threads (the admin role); 403 for anyone else."""
    if not isinstance(principal, User) or not principal.has_perm("checkpoints.cancel_thread"):
        raise Forbidden("Cancelling or resuming a thread needs the admin role.")
    return principal


def check_can_delete(principal: Any) -> User:
    """The person who may delete threads (the admin role); 403 for anyone else."""
    if not isinstance(principal, User) or not principal.has_perm("checkpoints.delete_thread"):
        raise Forbidden("Deleting a thread needs the admin role.")
    return principal
