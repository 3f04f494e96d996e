"""The OpenAI Agents SDK on Quicksave: QuicksaveSession (session), tool approvals filed in the
inbox and decided there (approvals), agents resumed by the worker (runner), dashboard forks of a
conversation (forks) and a demo agent on a scripted model (demo).

Only session, approvals, runner and demo import the SDK (`openai-agents`, from
requirements-openai-agents.txt); the app itself and its fork shaper load without it, and the
core (checkpoints, approvals, quicksave_agents) never imports this package."""
