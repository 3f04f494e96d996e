"""Reading states without filling the process's state cache: `storage.states_along` (a whole trajectory,
replayed once) and `state_at(cache=False)` (a state read once, as the training exports read it)."""

from __future__ import annotations

import pytest

from checkpoints import forks, storage, trajectories
from checkpoints.models import Checkpoint, Thread
from checkpoints.storage.nodes import states
from quicksave_agents.models import Agent
from tests.conftest import person

pytestmark = pytest.mark.django_db
# The cache keeps what a read learnt once its transaction commits (lru.LRU.remember): the tests that
# look at it commit, as a server's reads do.
committing = pytest.mark.django_db(transaction=True)


def grown(agent: Agent, steps: int) -> tuple[Thread, list[Checkpoint]]:
    thread, _ = storage.create_thread(agent=agent)
    written = [
        storage.append_checkpoint(thread=thread, parent=None, state={"messages": [{"role": "user", "content": "hi"}]})
    ]
    for step in range(1, steps):
        role = "assistant" if step % 2 else "user"
        written.append(storage.append_checkpoint(thread=thread, parent=written[-1], patch=[
            {"op": "add", "path": "/messages/-", "value": {"role": role, "content": f"message {step} " * 50}}
        ]))  # fmt: skip
    return Thread.objects.get(pk=thread.pk), written


@committing
def test_history_gives_every_state_on_the_path_once_and_caches_none(agent: Agent) -> None:
    _, written = grown(agent, 40)
    expected = [storage.state_at(checkpoint.pk, cache=False) for checkpoint in written]
    storage.clear_caches()
    seen = [(row.id, storage.clone(state)) for row, state in storage.states_along(written[-1].pk)]
    assert [checkpoint_id for checkpoint_id, _ in seen] == [checkpoint.pk for checkpoint in written]
    assert [state for _, state in seen] == expected
    assert len(states) == 0


def test_history_follows_a_fork_back_through_its_parent_branch(agent: Agent) -> None:
    thread, written = grown(agent, 6)
    fork = forks.fork(checkpoint=written[2], user=person("ada", "admin"), reason="try again")
    patch = [{"op": "add", "path": "/messages/-", "value": {"role": "user", "content": "b"}}]
    child = storage.append_checkpoint(thread=thread, parent=fork, branch=fork.branch.name, patch=patch)
    path = [row.id for row, _ in storage.states_along(child.pk)]
    assert path == [written[0].pk, written[1].pk, written[2].pk, fork.pk, child.pk]
    *_, (_, last) = storage.states_along(child.pk)
    assert last == storage.state_at(child.pk)


def test_history_refuses_a_row_altered_outside_quicksave(agent: Agent) -> None:
    _, written = grown(agent, 5)
    Checkpoint.objects.filter(pk=written[2].pk).update(label="tampered")
    with pytest.raises(storage.IntegrityFailure):
        list(storage.states_along(written[-1].pk))


@committing
def test_a_read_without_the_cache_leaves_it_as_it_was(agent: Agent) -> None:
    _, written = grown(agent, 10)
    storage.clear_caches()
    assert storage.state_at(written[-1].pk, cache=False) == storage.state_at(written[-1].pk)
    assert len(states) == 1  # only the second, cached read


@committing
def test_the_fine_tuning_export_of_many_threads_keeps_no_state_in_the_cache(agent: Agent) -> None:
    for _ in range(5):
        grown(agent, 8)
    storage.clear_caches()
    assert len(list(trajectories.fine_tuning_records(Thread.objects.all()))) == 5
    assert len(states) == 0
