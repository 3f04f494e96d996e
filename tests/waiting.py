"""Waiting on a condition, for tests that synchronise with other threads and processes.

A test that needs something to have happened asks for it by name and gets it, or fails saying
what it was waiting for; it never sleeps for a guessed time and hopes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(
    condition: Callable[[], T | None], *, what: str, timeout: float = 30, every: float = 0.05,
    details: Callable[[], str] | None = None,
) -> T:  # fmt: skip
    """Call `condition` until it returns something truthy, and return that.

    Raises TimeoutError naming `what` (and whatever `details` says, a worker's log, say) when
    `timeout` seconds pass first. `every` is only the polling interval: the wait ends as soon as
    a check passes.
    """
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() > deadline:
            message = f"waited {timeout:g} s for {what}"
            if details is not None:
                message += "\n" + details()
            raise TimeoutError(message)
        time.sleep(every)
