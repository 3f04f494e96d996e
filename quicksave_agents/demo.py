"""Three deterministic demo agents (no network, no language model) that show what Quicksave is for.

Their names start with `demo-`: the worker drives every thread of a registered agent, so a demo
agent named like one of yours (`travel`) would run the demo's code on your threads.

- demo-travel: searches flights with a priced fake tool, asks approval to book the best one; once
  approved it re-checks the price and, if it moved since the request, asks again instead of booking.
- demo-code-review: reviews ten files, one per step, posting each review (not idempotent). A crash can
  be injected at file 8; after a restart it resumes at file 8 and no file is reviewed twice: a
  review that may have been posted without its result recorded is put to a person.
- demo-migration: a wrong batch size chosen at step 15 makes step 20 fail — material for rewind and branch.

Every fake tool with a side effect appends one line to the ledger file named by
QUICKSAVE_DEMO_LEDGER (when set), so tests can count side effects across processes.
QUICKSAVE_DEMO_CRASH=<agent>:<step>:<before_tool|after_tool> makes the worker SIGKILL itself there.
"""

from __future__ import annotations

import hashlib
import os
import signal
from collections.abc import Callable
from typing import Any

from quicksave_agents.runtime import Agent, Context, Continue, Done, Fail, StepResult, register

FILES = [
    f"src/{name}.py" for name in ("api", "auth", "billing", "cache", "cli", "db", "jobs", "models", "search", "views")
]
TABLES = [f"table_{n:02d}" for n in range(1, 21)]

# Demos that agent modules add (an integration's demo agent): `seed_demo` calls each to start its thread.
_seeders: list[Callable[[], Any]] = []


def register_seeder(seed: Callable[[], Any]) -> Callable[[], Any]:
    """Decorator: make `manage.py seed_demo` call `seed()`, which starts a demo thread and returns it."""
    if seed not in _seeders:
        _seeders.append(seed)
    return seed


def seeders() -> list[Callable[[], Any]]:
    return list(_seeders)


def side_effect(tool: str, detail: str) -> None:
    """Record that a fake tool did something irreversible (appends one line, flushed to disk)."""
    ledger = os.environ.get("QUICKSAVE_DEMO_LEDGER")
    if not ledger:
        return
    with open(ledger, "a", encoding="utf-8") as handle:
        handle.write(f"{tool}\t{detail}\n")
        handle.flush()
        os.fsync(handle.fileno())


def maybe_crash(agent: str, step: int, point: str) -> None:
    """Die like a killed worker, if QUICKSAVE_DEMO_CRASH asks for it at this point."""
    if os.environ.get("QUICKSAVE_DEMO_CRASH") == f"{agent}:{step}:{point}":
        os.kill(os.getpid(), signal.SIGKILL)


def _price(flight: str, check: int, jump: bool) -> int:
    base = 300 + int(hashlib.sha256(flight.encode()).hexdigest()[:4], 16) % 300
    # A jump moves the market price up from the first re-check on, and it stays up.
    return base + (45 if jump and check >= 1 else 0)


@register
class TravelAgent(Agent):
    name = "demo-travel"
    action_schemas = {
        "book_flight": {
            "type": "object",
            "required": ["flight", "price"],
            "properties": {
                "flight": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{2,4}$"},
                "price": {"type": "number", "minimum": 0},
            },
            "additionalProperties": False,
        }
    }

    def initial_state(self, **inputs: Any) -> dict[str, Any]:
        return {
            "trip": {
                "from": inputs.get("origin", "OSL"),
                "to": inputs.get("destination", "FCO"),
                "date": inputs.get("date", "2026-12-18"),
            },
            "price_jump": bool(inputs.get("price_jump", False)),
            "phase": "search",
            "offers": [],
            "quote": None,
            "checks": 0,
            "booking": None,
            "messages": [{"role": "user", "content": f"Book me a flight to {inputs.get('destination', 'FCO')}."}],
        }

    def step(self, ctx: Context) -> StepResult:
        state = ctx.state
        phase = state["phase"]
        if phase == "search":
            offers = ctx.tool("search_flights", state["trip"], _search_flights, idempotent=True)
            state["offers"] = offers
            best = min(offers, key=lambda offer: offer["price"])
            state["quote"] = {"flight": best["flight"], "price": best["price"]}
            state["messages"].append(
                {"role": "assistant", "content": f"Cheapest: {best['flight']} at {best['price']} EUR."}
            )
            state["phase"] = "approve"
            return Continue("search_flights")
        if phase == "approve":
            decision = ctx.request_approval("book_flight", state["quote"], f"Book {state['quote']['flight']} for "
                                            f"{state['quote']['price']} EUR?")  # fmt: skip
            if not decision.approved:
                state["messages"].append({"role": "assistant", "content": f"Not booking: {decision.comment}"})
                state["phase"] = "declined"
                return Done("declined")
            state["quote"] = decision.args
            state["phase"] = "recheck"
            return Continue("approved" + (" with edits" if decision.edited else ""))
        if phase == "recheck":
            state["checks"] += 1
            args = {"flight": state["quote"]["flight"], "check": state["checks"], "jump": state["price_jump"]}
            price = ctx.tool("check_price", args, _check_price, idempotent=True)
            if price != state["quote"]["price"]:
                state["messages"].append({"role": "assistant",
                                          "content": f"The price moved to {price} EUR; asking again."})  # fmt: skip
                state["quote"] = {"flight": state["quote"]["flight"], "price": price}
                state["phase"] = "approve"
                return Continue("price_changed")
            state["phase"] = "book"
            return Continue("price_confirmed")
        if phase == "book":
            # The airline's API deduplicates on the idempotency key, so a booking that may or may
            # not have gone through is safely sent again.
            state["booking"] = ctx.tool("book_flight", state["quote"], _book_flight, idempotent=True)
            state["messages"].append({"role": "assistant", "content": f"Booked: {state['booking']['reference']}."})
            state["phase"] = "booked"
            return Done("booked")
        return Fail(f"unknown phase {phase!r}")


def _search_flights(trip: dict[str, Any]) -> list[dict[str, Any]]:
    side_effect("search_flights", f"{trip['from']}-{trip['to']}")
    flights = [f"SK{n}" for n in (401, 415, 429)] + ["AZ611"]
    return [{"flight": flight, "price": _price(flight, 0, False), "stops": n % 2} for n, flight in enumerate(flights)]


def _check_price(args: dict[str, Any]) -> int:
    side_effect("check_price", f"{args['flight']}#{args['check']}")
    return _price(args["flight"], args["check"], args["jump"])


def _book_flight(quote: dict[str, Any], idempotency_key: str) -> dict[str, Any]:
    side_effect("book_flight", quote["flight"])
    # The booking reference the airline would give back for this idempotency key, every time.
    return {"reference": "QS-" + hashlib.sha256(idempotency_key.encode()).hexdigest()[:6].upper(), **quote}


@register
class CodeReviewAgent(Agent):
    name = "demo-code-review"

    def initial_state(self, **inputs: Any) -> dict[str, Any]:
        return {"files": FILES, "next": 0, "reviews": {}, "repository": inputs.get("repository", "acme/shop")}

    def step(self, ctx: Context) -> StepResult:
        state = ctx.state
        if state["next"] >= len(state["files"]):
            return Done("review complete")
        number = state["next"] + 1
        path = state["files"][state["next"]]
        maybe_crash(self.name, number, "before_tool")
        review = ctx.tool("review_file", {"repository": state["repository"], "path": path}, _review_file)
        maybe_crash(self.name, number, "after_tool")
        state["reviews"][path] = review
        state["next"] += 1
        return Continue(f"review {path}")


def _review_file(args: dict[str, Any]) -> dict[str, Any]:
    side_effect("review_file", args["path"])
    digest = int(hashlib.sha256(args["path"].encode()).hexdigest()[:6], 16)
    return {"comments": digest % 4, "verdict": "changes requested" if digest % 3 == 0 else "approved"}


@register
class MigrationAgent(Agent):
    name = "demo-migration"

    def initial_state(self, **inputs: Any) -> dict[str, Any]:
        return {"tables": TABLES, "migrated": [], "settings": {}, "log": []}

    def step(self, ctx: Context) -> StepResult:
        state = ctx.state
        number = len(state["migrated"]) + 1
        if number > len(state["tables"]):
            return Done("migration complete")
        table = state["tables"][number - 1]
        if number == 15:
            # The mistake: with no batch size set yet, the agent picks one far too large.
            state["settings"].setdefault("batch_size", 5000)
        if number == 20 and state["settings"].get("batch_size", 0) > 1000:
            state["log"].append(f"{table}: lock timeout with batch_size={state['settings']['batch_size']}")
            return Fail(
                f"{table}: lock wait timeout exceeded (batch_size {state['settings']['batch_size']} is too large)"
            )
        rows = ctx.tool("migrate_table", {"table": table, "batch_size": state["settings"].get("batch_size", 500)},
                        _migrate_table)  # fmt: skip
        state["migrated"].append(table)
        state["log"].append(f"{table}: {rows} rows")
        return Continue(f"migrate {table}")


def _migrate_table(args: dict[str, Any]) -> int:
    side_effect("migrate_table", args["table"])
    return 1000 + int(hashlib.sha256(args["table"].encode()).hexdigest()[:4], 16) % 9000
