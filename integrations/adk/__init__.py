"""Google ADK on Quicksave: QuicksaveSessionService (sessions: a session is a thread, each event a
checkpoint), tool confirmations filed as approvals (confirmations), tool calls through the
exactly-once tool-call log (tools), invocations resumed by the worker when a person decides
(runner) and the demo agent `seed_demo` starts (demo).

This package's modules import ADK only where they use it, so the app is installed whether or not
requirements-adk.txt is; the core (checkpoints, approvals, agents) never imports it."""
