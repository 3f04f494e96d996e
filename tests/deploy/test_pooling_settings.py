"""The settings behind a pooler in transaction mode: no prepared statements unless the pooler keeps
them, no server-side cursors, and a direct connection for LISTEN, without which Quicksave refuses
to start."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.processes import ROOT

SCRIPT = """
import json
from django.conf import settings
db = settings.DATABASES["default"]
print(json.dumps({"prepare": db["OPTIONS"]["prepare_threshold"], "cursors": db["DISABLE_SERVER_SIDE_CURSORS"],
                  "listen": [settings.DATABASE_LISTEN["HOST"], settings.DATABASE_LISTEN["PORT"]]}))
"""


def settings_with(**env: str) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "DJANGO_SETTINGS_MODULE": "quicksave.settings",
                   "DATABASE_URL": "postgresql://quicksave@pgbouncer.internal:6432/quicksave", **env}  # fmt: skip
    for name in ("DATABASE_TRANSACTION_POOLING", "DATABASE_PREPARED_STATEMENTS", "DATABASE_LISTEN_URL"):
        if name not in env:
            environment.pop(name, None)
    return subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=environment, capture_output=True, text=True,
                          timeout=60)  # fmt: skip


def test_without_a_pooler_statements_are_prepared_and_listen_uses_the_same_server() -> None:
    result = settings_with()
    assert json.loads(result.stdout) == {"prepare": 5, "cursors": False, "listen": ["pgbouncer.internal", "6432"]}


def test_transaction_pooling_prepares_nothing_declares_no_cursors_and_listens_directly() -> None:
    result = settings_with(DATABASE_TRANSACTION_POOLING="true",
                           DATABASE_LISTEN_URL="postgresql://quicksave@postgres.internal:5432/quicksave")  # fmt: skip
    assert json.loads(result.stdout) == {"prepare": None, "cursors": True, "listen": ["postgres.internal", "5432"]}


def test_a_pooler_that_keeps_prepared_statements_gets_them() -> None:
    result = settings_with(DATABASE_TRANSACTION_POOLING="true", DATABASE_PREPARED_STATEMENTS="true",
                           DATABASE_LISTEN_URL="postgresql://quicksave@postgres.internal:5432/quicksave")  # fmt: skip
    assert json.loads(result.stdout)["prepare"] == 5


def test_transaction_pooling_without_a_direct_listen_connection_refuses_to_start() -> None:
    result = settings_with(DATABASE_TRANSACTION_POOLING="true")
    assert result.returncode != 0
    assert "DATABASE_LISTEN_URL must be set with DATABASE_TRANSACTION_POOLING" in result.stderr
