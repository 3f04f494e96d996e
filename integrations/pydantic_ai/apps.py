from django.apps import AppConfig


class PydanticAIConfig(AppConfig):
    name = "integrations.pydantic_ai"
    label = "pydantic_ai_integration"
    verbose_name = "Pydantic AI"

    def ready(self) -> None:
        from checkpoints.forks import register_fork_shaper
        from integrations.pydantic_ai.forks import pydantic_ai_fork

        # Dashboard forks work without Pydantic AI installed: the shaper needs no Pydantic AI import.
        register_fork_shaper(pydantic_ai_fork)
