"""Tool-call benchmark: what logging each call's intent and result costs an agent's step.

Usage (from /work/main)::

    .venv/bin/python bench/tool_calls.py              # 1,000 steps, 3 rounds of each agent
    .venv/bin/python bench/tool_calls.py --steps 200 --rounds 1

Two in-process agents run through the real worker loop (`quicksave_agents.worker.Worker.run_once`: a claimed
run, its heartbeat, every write fenced) against the `quicksave_bench` database, taking turns round
by round so both see the same machine:

- `bench-tool-call`: each step makes one tool call through `ctx.tool` (an intent committed before
  the call, the result after) and appends the result to the state; the checkpoint follows.
- `bench-no-tool`: the same step with the tool called directly, so nothing is logged: only the
  checkpoint is committed.

A step with a call commits three times (intent, result, checkpoint), one without it once; the target
is a ratio of at least 0.4. Each agent's figure is its median round. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent
_ROOT = _HERE.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

from bench.quicksave_runs import setup_django  # noqa: E402

TARGET_RATIO = 0.4


def lookup(args: dict[str, Any]) -> dict[str, Any]:
    """A tool with a small answer, as a price lookup or a ticket update has."""
    return {"n": args["n"], "price": 100 + args["n"] % 37, "currency": "EUR"}


def define_agents(steps: int) -> tuple[type[Any], type[Any]]:
    from quicksave_agents.runtime import Agent, Context, Continue, Done, StepResult, register

    class _Stepper(Agent):
        logged = True

        def initial_state(self, **inputs: Any) -> dict[str, Any]:
            return {"n": 0, "quotes": []}

        def step(self, ctx: Context) -> StepResult:
            n = ctx.state["n"] + 1
            args = {"n": n, "route": "OSL-FCO"}
            quote = ctx.tool("lookup", args, lookup) if self.logged else lookup(args)
            ctx.state["quotes"].append(quote)
            ctx.state["n"] = n
            return Done("done") if n >= steps else Continue(f"step {n}")

    @register
    class ToolCallAgent(_Stepper):
        name = "bench-tool-call"

    @register
    class NoToolAgent(_Stepper):
        name = "bench-no-tool"
        logged = False

    return ToolCallAgent, NoToolAgent


def one_round(agent_class: type[Any], steps: int, round_number: int) -> float:
    """Steps per second of one thread of `steps` steps, from the claim to the last checkpoint."""
    from checkpoints.models import Checkpoint, Thread, ThreadStatus
    from quicksave_agents.models import ToolCall
    from quicksave_agents.runtime import start_thread
    from quicksave_agents.worker import Worker

    worker = Worker(agent_names=[agent_class.name], name=f"bench-{agent_class.name}")
    thread = start_thread(agent_class=agent_class, external_id=f"round-{round_number}-{time.time_ns()}")
    started = time.perf_counter()
    while worker.run_once():
        pass
    elapsed = time.perf_counter() - started
    thread = Thread.objects.get(pk=thread.pk)
    written = Checkpoint.objects.filter(thread=thread).count() - 1  # the start checkpoint is not a step
    calls = ToolCall.objects.filter(thread=thread, state="done").count()
    expected_calls = steps if agent_class.logged else 0
    if thread.status != ThreadStatus.COMPLETED or written != steps or calls != expected_calls:
        raise RuntimeError(f"{agent_class.name}: {thread.status}, {written} steps, {calls} calls logged")
    return steps / elapsed


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    options = parser.parse_args(argv)
    setup_django()
    from django.conf import settings

    settings.QUICKSAVE_AGENT_MODULES = []  # only this bench's agents
    tool_agent, plain_agent = define_agents(options.steps)
    rates: dict[str, list[float]] = {tool_agent.name: [], plain_agent.name: []}
    for number in range(1, options.rounds + 1):
        for agent_class in (plain_agent, tool_agent) if number % 2 else (tool_agent, plain_agent):
            rate = one_round(agent_class, options.steps, number)
            rates[agent_class.name].append(rate)
            print(f"round {number}: {agent_class.name:16} {rate:7.1f} steps/s", flush=True)
    with_calls = statistics.median(rates[tool_agent.name])
    without = statistics.median(rates[plain_agent.name])
    ratio = with_calls / without
    print(f"{options.steps} steps, median of {options.rounds} rounds: {with_calls:.1f} steps/s with a logged call "
          f"per step, {without:.1f} without; ratio {ratio:.2f} (target >= {TARGET_RATIO})")  # fmt: skip
    result = {
        "steps": options.steps,
        "rounds": options.rounds,
        "steps_per_s_tool_call": round(with_calls, 1),
        "steps_per_s_no_tool": round(without, 1),
        "tool_call_over_no_tool": round(ratio, 3),
        "target": TARGET_RATIO,
        "rounds_tool_call": [round(rate, 1) for rate in rates[tool_agent.name]],
        "rounds_no_tool": [round(rate, 1) for rate in rates[plain_agent.name]],
    }
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
