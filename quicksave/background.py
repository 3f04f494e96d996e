"""Background services that run beside the agent worker: an app registers one when it is ready,
and `run_agents` (and the embedded one-process server) start every registered service.

The registry keeps the core ignorant of the apps that register: the worker starts "the
services", not the notifications dispatcher by name. Each service runs until its `stopping`
event is set, and must survive its own failures (log, wait, try again).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from django.db import connections

log = logging.getLogger(__name__)

Service = Callable[[threading.Event], None]

_services: dict[str, Service] = {}


def register(name: str, serve: Service) -> None:
    """Register `serve(stopping)` under `name` (registering a name again replaces it)."""
    _services[name] = serve


def registered() -> dict[str, Service]:
    return dict(_services)


def start_all(stopping: threading.Event) -> list[threading.Thread]:
    """Start every registered service in a daemon thread of this process; returns the threads."""
    threads = []
    for name, serve in registered().items():
        thread = threading.Thread(target=_run, args=(name, serve, stopping), name=f"service-{name}", daemon=True)
        thread.start()
        threads.append(thread)
    return threads


def _run(name: str, serve: Service, stopping: threading.Event) -> None:
    try:
        serve(stopping)
    except Exception:
        log.exception("the background service %s stopped", name)
    finally:
        connections.close_all()
