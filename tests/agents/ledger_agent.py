"""An agent whose every tool call leaves a row in a ledger table outside Quicksave's control, and
that can kill or freeze its own worker at each boundary of a call: the subject of test_exactly_once.

The ledger stands for the outside world. It is written on a connection of its own, in autocommit,
so nothing Quicksave commits or rolls back touches it. `charge` is idempotent the way a payment API
is: a second request with the same idempotency key is answered without charging again (a unique
key). `send_email` is not: every execution sends another email (another row).

QUICKSAVE_TEST_FAULT=<point>:<step> makes the worker SIGKILL itself at that point of that step
(`freeze` points SIGSTOP it instead). The points, in the order a call crosses them:

- before_intent: in the step, before the call (nothing recorded yet)
- before_effect: in the tool, after the intent was committed, before the ledger row
- after_effect: in the tool, after the ledger row, before the result was committed
- after_result: in the step, after the call returned, before the step's checkpoint
"""

from __future__ import annotations

import os
import signal
from typing import Any

import psycopg

from quicksave_agents.runtime import Agent, Context, Continue, Done, StepResult, register

LEDGER_TABLE = "test_exactly_once_ledger"
LEDGER_DDL = f"""
CREATE TABLE IF NOT EXISTS {LEDGER_TABLE} (
    id bigserial PRIMARY KEY,
    thread text NOT NULL,
    tool text NOT NULL,
    step int NOT NULL,
    idempotency_key text UNIQUE,
    pid int NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp()
)
"""


def fault(point: str, step: int) -> None:
    """Die (or freeze) like a killed worker, if QUICKSAVE_TEST_FAULT asks for it here."""
    wanted = os.environ.get("QUICKSAVE_TEST_FAULT", "")
    for action, sig in (("kill", signal.SIGKILL), ("freeze", signal.SIGSTOP)):
        if wanted == f"{action}:{point}:{step}":
            os.kill(os.getpid(), sig)


def _ledger() -> psycopg.Connection[Any]:
    return psycopg.connect(os.environ["QUICKSAVE_TEST_LEDGER_URL"], autocommit=True)


@register
class LedgerAgent(Agent):
    name = "ledger"

    def initial_state(self, **inputs: Any) -> dict[str, Any]:
        return {"steps": int(inputs.get("steps", 3)), "idempotent": bool(inputs.get("idempotent")), "done": []}

    def step(self, ctx: Context) -> StepResult:
        state = ctx.state
        number = len(state["done"]) + 1
        if number > state["steps"]:
            return Done("all sent")
        thread = str(ctx.thread.pk)
        fault("before_intent", number)
        if state["idempotent"]:

            def charge(args: dict[str, Any], idempotency_key: str) -> dict[str, Any]:
                fault("before_effect", number)
                with _ledger() as ledger:
                    ledger.execute(
                        f"INSERT INTO {LEDGER_TABLE} (thread, tool, step, idempotency_key, pid)"
                        " VALUES (%s, 'charge', %s, %s, %s) ON CONFLICT (idempotency_key) DO NOTHING",
                        [thread, args["step"], idempotency_key, os.getpid()],
                    )
                fault("after_effect", number)
                return {"charged": args["amount"], "receipt": idempotency_key[:10]}

            result = ctx.tool("charge", {"step": number, "amount": 10 * number}, charge, idempotent=True)
        else:

            def send_email(args: dict[str, Any]) -> dict[str, Any]:
                fault("before_effect", number)
                with _ledger() as ledger:
                    ledger.execute(
                        f"INSERT INTO {LEDGER_TABLE} (thread, tool, step, pid) VALUES (%s, 'send_email', %s, %s)",
                        [thread, args["step"], os.getpid()],
                    )
                fault("after_effect", number)
                return {"sent_to": args["to"]}

            result = ctx.tool("send_email", {"step": number, "to": f"user{number}@example.com"}, send_email)
        fault("after_result", number)
        state["done"].append(result)
        return Continue(f"call {number}")
