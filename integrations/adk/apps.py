from django.apps import AppConfig


class AdkConfig(AppConfig):
    name = "integrations.adk"
    label = "adk_integration"
    verbose_name = "Google ADK"

    def ready(self) -> None:
        from agents.demo import register_demo

        # seed_demo starts the ADK demo only when ADK is installed (requirements-adk.txt).
        register_demo("integrations.adk.demo.seed")
