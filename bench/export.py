"""Training-export benchmark (issue 30): fine-tuning JSONL and preference pairs at volume.

Usage (from the repository root, with the project's venv and DATABASE_URL's server)::

    BENCH_DATABASE_NAME=quicksave_bench_export .venv/bin/python bench/export.py
    .venv/bin/python bench/export.py --threads 1000 --steps 100 --pairs 200

Set-up: `--threads` threads of `--steps` checkpoints each, whose `messages` list grows by one
message a step (a user turn, then assistant tool calls and their results in turn, and a final
answer), and `--pairs` approvals on as many threads, decided half as edited approvals and half
as rejections with a comment. Built in the bench database (``BENCH_DATABASE_NAME``, default
``quicksave_bench``; see bench.quicksave_runs) and reused when an earlier run left it complete.

Each export runs in a fresh child process writing to a byte counter (no disk), through
`checkpoints.trajectories` (the one way out the command and the API use):

- fine-tuning JSONL of the first 100 threads and of all of them (picked with the export's own
  time-range filter), threads per second and the export's peak RSS (VmHWM, reset after Django's
  start-up, whose own peak would otherwise hide a small export's); the ratio of the two peaks
  says whether memory stays flat (target <= 1.2; fine-tuning target >= 200 threads/s);
- preference pairs over all threads (`rejections=comment`), pairs and seconds;
- OpenTelemetry GenAI spans of all threads (`checkpoints.genai.export`, the one `manage.py
  export_genai` runs, content off) sent over OTLP/HTTP to a receiver this script runs on loopback,
  which reads each request and answers 200: spans per second.

The peak-RSS pair is measured twice, interleaved: with the export reading states as it does now
(kept out of the engine's state cache, `storage.state_at(cache=False)`), and as it read them
before (`--cached-reads`: through the process-wide cache, which fills with every head read).

The last line printed is one JSON object with `sft_threads_per_s`, `dpo_pairs`, `dpo_seconds`,
`otel_spans_per_s` and `peak_rss_ratio_1000_over_100` (and the cached-reads ratio beside it,
`peak_rss_ratio_1000_over_100_cached_reads`).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent
_ROOT = _HERE.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

from bench.quicksave_runs import setup_django  # noqa: E402

AGENT = "bench-export"
SMALL = 100


def message(step: int, steps: int) -> dict[str, Any]:
    """The message step `step` adds: a user turn, then tool calls and results in turn, a final answer."""
    if step == 0:
        return {"role": "user", "content": "Plan a three-city trip, please. " * 4}
    if step == steps - 1:
        return {"role": "assistant", "content": "Here is the plan. " * 10}
    call_id = f"call_{(step + 1) // 2}"
    if step % 2 == 1:
        arguments = json.dumps({"city": f"city {step}", "nights": step % 5 + 1})
        call = {"id": call_id, "type": "function", "function": {"name": "search_hotels", "arguments": arguments}}
        return {"role": "assistant", "content": None, "tool_calls": [call]}
    return {"role": "tool", "tool_call_id": call_id, "content": f"3 hotels near the centre of city {step}. " * 3}


def build(*, threads: int, steps: int, pairs: int) -> None:
    from django.contrib.auth.models import User

    from approvals.models import ApprovalRequest
    from approvals.services import decide, request_approval
    from checkpoints import storage
    from checkpoints.models import Thread
    from quicksave.roles import grant_role
    from quicksave_agents.keys import get_or_create_agent

    existing = Thread.objects.filter(agent__name=AGENT, step=steps - 1).count()
    decided = ApprovalRequest.objects.filter(thread__agent__name=AGENT, decided_at__isnull=False).count()
    if existing == threads == Thread.objects.filter(agent__name=AGENT).count() and decided == pairs:
        return
    print(f"Building {threads:,} threads of {steps} checkpoints and {pairs} decided approvals…", flush=True)
    started = time.perf_counter()
    for old in Thread.objects.filter(agent__name=AGENT):
        storage.delete_thread(old)
    agent = get_or_create_agent(name=AGENT)
    reviewer, _ = User.objects.get_or_create(username="bench-export-reviewer")
    grant_role(user=reviewer, role="reviewer")
    tools = [{"type": "function", "function": {"name": "search_hotels", "parameters": {"type": "object"}}}]
    for number in range(threads):
        thread, _ = storage.create_thread(agent=agent)
        head = storage.append_checkpoint(
            thread=thread, parent=None, state={"messages": [message(0, steps)], "tools": tools}, step=0
        )
        for step in range(1, steps):
            head = storage.append_checkpoint(
                thread=thread, parent=head, step=step, status="completed" if step == steps - 1 else "running",
                patch=[{"op": "add", "path": "/messages/-", "value": message(step, steps)}],
            )  # fmt: skip
            if number < pairs and step == steps // 2 + 1:  # an assistant's tool call: the proposal
                approval = request_approval(thread=thread, checkpoint=head, action="search_hotels",
                                            args={"city": f"city {step}", "nights": 2})  # fmt: skip
                if number % 2:
                    decide(approval=approval, user=reviewer, decision="approve", args={"city": "Porto", "nights": 3})
                else:
                    decide(approval=approval, user=reviewer, decision="reject", comment="Ask for the budget first.")
        if (number + 1) % 100 == 0:
            print(f"  {number + 1:,} threads, {time.perf_counter() - started:.0f} s", flush=True)
    print(f"  built in {time.perf_counter() - started:.1f} s", flush=True)


def child(kind: str, limit: int | None, *, cached_reads: bool = False, endpoint: str = "") -> dict[str, Any]:
    """One export in this (fresh) process: lines, skipped, seconds, peak RSS in KiB."""
    from checkpoints import storage, trajectories
    from checkpoints.models import Thread

    if cached_reads:  # the export as it read states before: through the process-wide state cache
        trajectories._state = lambda checkpoint_id: storage.state_at(checkpoint_id)
    reset_peak()
    if kind == "otel":
        return otel_child(endpoint)

    threads = Thread.objects.filter(agent__name=AGENT)
    until = None
    if limit is not None:
        cut = threads.order_by("created_at", "pk").values_list("created_at", flat=True)[limit : limit + 1]
        until = cut[0] if cut else None
    chosen = trajectories.Filter(agent=AGENT, until=until).apply(Thread.objects.all())
    tally = trajectories.Tally()
    records = (
        trajectories.fine_tuning_records(chosen, tally=tally)
        if kind == "sft"
        else trajectories.preference_records(chosen, rejections="comment", tally=tally)
    )
    written = 0
    started = time.perf_counter()
    for chunk in trajectories.lines(records):
        written += len(chunk)
    seconds = time.perf_counter() - started
    return {
        "kind": kind, "seen": tally.seen, "lines": tally.written, "skipped": tally.skipped, "bytes": written,
        "seconds": round(seconds, 3), "peak_rss_kib": peak_kib(),
    }  # fmt: skip


def otel_child(endpoint: str) -> dict[str, Any]:
    """All threads' GenAI spans, sent to `endpoint`: spans, threads, skipped, seconds."""
    from checkpoints import genai
    from checkpoints.models import Thread
    from quicksave import telemetry

    exporter = telemetry.span_exporter(endpoint, timeout=60)
    pages = genai.thread_pages(Thread.objects.filter(agent__name=AGENT))
    started = time.perf_counter()
    sent = genai.export(pages, exporter)
    seconds = time.perf_counter() - started
    exporter.shutdown()
    return {
        "kind": "otel", "spans": sent.spans, "threads": sent.threads, "skipped": sent.skipped,
        "seconds": round(seconds, 3), "peak_rss_kib": peak_kib(),
    }  # fmt: skip


class Sink:
    """An OTLP/HTTP receiver on loopback that reads each request and answers 200 (an empty
    ExportTraceServiceResponse is zero bytes), counting requests and bytes."""

    def __init__(self) -> None:
        sink = self
        self.requests = self.bytes = 0

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                sink.bytes += len(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                sink.requests += 1
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def reset_peak() -> None:
    """Forget the peak RSS so far (Linux: writing 5 to /proc/self/clear_refs resets VmHWM): the
    peak measured is then the export's own, not Django's start-up (its migration check), which
    is higher than a small export's and would hide its growth."""
    try:
        with open("/proc/self/clear_refs", "w") as clear:
            clear.write("5")
    except OSError:
        pass


def peak_kib() -> int:
    """The peak RSS since `reset_peak` (VmHWM), or over the process's life where that is unknown."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def run_child(kind: str, limit: int | None, *, cached_reads: bool = False, endpoint: str = "") -> dict[str, Any]:
    command = [sys.executable, __file__, "--child", kind] + (["--limit", str(limit)] if limit else [])
    command += (["--cached-reads"] if cached_reads else []) + (["--endpoint", endpoint] if endpoint else [])
    output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    result: dict[str, Any] = json.loads(output.strip().splitlines()[-1])
    print(json.dumps({**result, "cached_reads": cached_reads}), flush=True)
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--pairs", type=int, default=200)
    parser.add_argument("--child", choices=["sft", "dpo", "otel"], help=argparse.SUPPRESS)
    parser.add_argument("--limit", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--cached-reads", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--endpoint", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    setup_django()
    if args.child:
        print(json.dumps(child(args.child, args.limit, cached_reads=args.cached_reads, endpoint=args.endpoint)))
        return
    build(threads=args.threads, steps=args.steps, pairs=args.pairs)
    # Interleaved: the cached-reads peers run beside the ones they are compared with.
    small_before = run_child("sft", min(SMALL, args.threads), cached_reads=True)
    small = run_child("sft", min(SMALL, args.threads))
    full_before = run_child("sft", None, cached_reads=True)
    full = run_child("sft", None)
    dpo = run_child("dpo", None)
    sink = Sink()
    otel = run_child("otel", None, endpoint=sink.url)
    sink.server.shutdown()
    print(json.dumps({
        "sft_threads_per_s": round(full["lines"] / full["seconds"], 1) if full["seconds"] else None,
        "sft_threads": full["lines"], "sft_skipped": full["skipped"], "sft_seconds": full["seconds"],
        "sft_threads_per_s_cached_reads": round(full_before["lines"] / full_before["seconds"], 1)
        if full_before["seconds"] else None,
        "dpo_pairs": dpo["lines"], "dpo_seconds": dpo["seconds"],
        "otel_spans_per_s": round(otel["spans"] / otel["seconds"], 1) if otel["seconds"] else None,
        "otel_spans": otel["spans"], "otel_threads": otel["threads"], "otel_seconds": otel["seconds"],
        "otel_requests": sink.requests, "otel_bytes": sink.bytes,
        "peak_rss_ratio_1000_over_100": round(full["peak_rss_kib"] / small["peak_rss_kib"], 3),
        "peak_rss_kib_100": small["peak_rss_kib"], "peak_rss_kib_all": full["peak_rss_kib"],
        "peak_rss_ratio_1000_over_100_cached_reads":
            round(full_before["peak_rss_kib"] / small_before["peak_rss_kib"], 3),
        "peak_rss_kib_100_cached_reads": small_before["peak_rss_kib"],
        "peak_rss_kib_all_cached_reads": full_before["peak_rss_kib"],
    }))  # fmt: skip


if __name__ == "__main__":
    main()
