"""The core runs without LangGraph: only the integration (integrations/langgraph/saver.py,
integrations/langgraph/runner.py) and its tests need requirements-langgraph.txt."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from tests.processes import ROOT, database_url

WITHOUT_LANGGRAPH = textwrap.dedent(
    """
    import sys

    class NoLangGraph:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in {"langgraph", "langchain", "langchain_core"}:
                raise ModuleNotFoundError(f"No module named {name!r}")
            return None

    sys.meta_path.insert(0, NoLangGraph())

    import django

    django.setup()
    from django.core.management import call_command

    call_command("check", "--fail-level", "ERROR")
    import quicksave.asgi  # every HTTP view, API view and websocket consumer
    import quicksave_agents.demo, quicksave_agents.worker, checkpoints.forks, checkpoints.retention, checkpoints.export

    print("loaded:", sorted(name for name in sys.modules if name.startswith(("langgraph", "langchain"))))
    """
)


def test_the_core_imports_and_checks_without_langgraph_installed() -> None:
    env = {**os.environ, "DATABASE_URL": database_url(), "DJANGO_SETTINGS_MODULE": "quicksave.settings",
           "QUICKSAVE_EMBEDDED_WORKER": "false"}  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_LANGGRAPH], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "loaded: []" in done.stdout
