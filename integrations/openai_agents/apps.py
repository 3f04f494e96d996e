from django.apps import AppConfig


class OpenAIAgentsConfig(AppConfig):
    name = "integrations.openai_agents"
    label = "openai_agents_integration"
    verbose_name = "OpenAI Agents SDK"

    def ready(self) -> None:
        from checkpoints.forks import register_fork_shaper
        from integrations.openai_agents.forks import openai_agents_fork

        # Dashboard forks work without the SDK installed: the shaper imports none of it.
        register_fork_shaper(openai_agents_fork)
