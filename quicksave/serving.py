"""How a Quicksave web process runs: the uvicorn options every launcher passes with its own host,
port and logging. `dev.py run` (stdlib only, so it spells them out), deploy/Dockerfile and
deploy/compose.yaml write them on their command lines; tests/deploy/test_serving.py checks that
each does, and that a server started with them answers as they say.

`--ws-per-message-deflate false`: websockets are not compressed. With per-message deflate each
socket keeps zlib's state both ways, about 300 KB at zlib's defaults (what uvicorn asks for), and
its pages are touched as events pass, so a server's memory grows with its sockets' traffic long
after they connect: 100 sockets on a bare uvicorn app took 12.6 MB at connection and 11 MB more
over their first 300 events each, against 2.6 MB and flat without. Quicksave's events are a few
hundred bytes of JSON; in bench/load.py's soak (200 sockets on two servers) this state was most
of the servers' growth from minute 1 to minute 7 (docs/benchmarks.md).
"""

from __future__ import annotations

UVICORN_OPTIONS: tuple[str, ...] = ("--ws-per-message-deflate", "false")
