"""LangGraph on Quicksave: QuicksaveSaver (saver; where its rows are and the queries that find
them in tables, its private copies of channel values and the ops between them in values, what it
remembers of each thread's last checkpoint in known), interrupts filed as approvals (interrupts),
graphs resumed by the worker (runner), dashboard forks made LangGraph checkpoints (forks) and
`manage.py import_langgraph` from a PostgresSaver database (importer).

This package's own modules import LangGraph only where they use it, so the app is installed
whether or not requirements-langgraph.txt is; the core (checkpoints, approvals, agents) never
imports it."""
