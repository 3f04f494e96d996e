"""The core runs without Pydantic AI: only the integration's agent, deferred and runner modules and
their tests need requirements-pydantic-ai.txt (the app itself, and its fork shaper, load without it)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from tests.processes import ROOT, database_url

WITHOUT_PYDANTIC_AI = textwrap.dedent(
    """
    import sys

    # As if not installed: `import` raises ModuleNotFoundError and `importlib.util.find_spec` says None.
    sys.modules["pydantic_ai"] = sys.modules["pydantic_graph"] = None

    import django

    django.setup()
    from django.core.management import call_command

    call_command("check", "--fail-level", "ERROR")
    import quicksave.asgi  # every HTTP view, API view and websocket consumer
    import quicksave_agents.demo, quicksave_agents.worker, checkpoints.forks, checkpoints.retention, checkpoints.export
    import integrations.pydantic_ai.forks

    from django.conf import settings

    assert "integrations.pydantic_ai.demo" not in settings.QUICKSAVE_AGENT_MODULES, settings.QUICKSAVE_AGENT_MODULES
    print("loaded:", sorted(name for name, module in sys.modules.items()
                            if name.startswith(("pydantic_ai", "pydantic_graph")) and module is not None))
    """
)


def test_the_core_imports_and_checks_without_pydantic_ai_installed() -> None:
    env = {**os.environ, "DATABASE_URL": database_url(), "DJANGO_SETTINGS_MODULE": "quicksave.settings",
           "QUICKSAVE_EMBEDDED_WORKER": "false"}  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_PYDANTIC_AI], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "loaded: []" in done.stdout
