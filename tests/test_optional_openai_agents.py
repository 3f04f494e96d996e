"""The core runs without the OpenAI Agents SDK: only integrations/openai_agents' session,
approvals, runner and demo modules and their tests need requirements-openai-agents.txt."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from tests.processes import ROOT, database_url

WITHOUT_OPENAI_AGENTS = textwrap.dedent(
    """
    import sys

    # As if not installed: `import agents` fails, and importlib.util.find_spec("agents") is None.
    sys.modules["agents"] = None
    sys.modules["openai"] = None

    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command

    call_command("check", "--fail-level", "ERROR")
    import quicksave.asgi  # every HTTP view, API view and websocket consumer
    import quicksave_agents.demo, quicksave_agents.worker, checkpoints.forks, integrations.openai_agents.forks

    print("modules:", settings.QUICKSAVE_AGENT_MODULES)
    print("loaded:", sorted(name for name, module in sys.modules.items()
                            if module is not None and name.split(".")[0] in {"agents", "openai"}))
    """
)


def test_the_core_imports_and_checks_without_the_openai_agents_sdk_installed() -> None:
    env = {**os.environ, "DATABASE_URL": database_url(), "DJANGO_SETTINGS_MODULE": "quicksave.settings",
           "QUICKSAVE_EMBEDDED_WORKER": "false"}  # fmt: skip
    env.pop("QUICKSAVE_AGENT_MODULES", None)
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_OPENAI_AGENTS], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "loaded: []" in done.stdout
    assert "integrations.openai_agents.demo" not in done.stdout  # its demo joins only with the SDK installed
