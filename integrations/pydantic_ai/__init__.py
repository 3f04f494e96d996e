"""Pydantic AI on Quicksave: `QuicksaveAgent` checkpoints a run's message history on a thread after
every model response and tool return (agent), a run that ends with `DeferredToolRequests` waits in
the inbox, one item per deferred call (deferred), the worker resumes it with the decisions as
`DeferredToolResults` (runner), and a dashboard fork of its checkpoints runs on from the edited
history (forks).

Only agent, deferred and runner import Pydantic AI, so the app is installed whether or not
requirements-pydantic-ai.txt is; the core (checkpoints, approvals, agents) never imports this package.
"""
