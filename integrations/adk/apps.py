from django.apps import AppConfig


class AdkConfig(AppConfig):
    name = "integrations.adk"
    label = "adk_integration"
    verbose_name = "Google ADK"

    def ready(self) -> None:
        from checkpoints.forks import register_fork_shaper
        from integrations.adk.forks import adk_fork

        # Dashboard forks of ADK sessions work without ADK installed: the shaper needs no ADK import.
        register_fork_shaper(adk_fork)
