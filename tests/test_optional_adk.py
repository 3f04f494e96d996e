"""The core runs without Google ADK: only the integration (integrations/adk/) and its tests need
requirements-adk.txt. Without it the server starts, and the demo agents leave the ADK one out."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from tests.processes import ROOT, database_url

WITHOUT_ADK = textwrap.dedent(
    """
    import sys

    class NoAdk:
        def find_spec(self, name, path=None, target=None):
            if name == "google.adk" or name.startswith(("google.adk.", "google.genai")):
                raise ModuleNotFoundError(f"No module named {name!r}")
            return None

    sys.meta_path.insert(0, NoAdk())

    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command

    call_command("check", "--fail-level", "ERROR")
    import quicksave.asgi  # every HTTP view, API view and websocket consumer
    import quicksave_agents.demo, quicksave_agents.worker, checkpoints.forks, checkpoints.retention, checkpoints.export

    print("modules:", settings.QUICKSAVE_AGENT_MODULES)
    print("loaded:", sorted(name for name in sys.modules if name.startswith(("google.adk", "google.genai"))))
    """
)


def test_the_core_imports_and_checks_without_adk_installed() -> None:
    env = {**os.environ, "DATABASE_URL": database_url(), "DJANGO_SETTINGS_MODULE": "quicksave.settings",
           "QUICKSAVE_EMBEDDED_WORKER": "false"}  # fmt: skip
    env.pop("QUICKSAVE_AGENT_MODULES", None)
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_ADK], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "modules: ['quicksave_agents.demo'" in done.stdout and "integrations.adk.demo" not in done.stdout
    assert "loaded: []" in done.stdout
