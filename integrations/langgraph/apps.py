from django.apps import AppConfig


class LangGraphConfig(AppConfig):
    name = "integrations.langgraph"
    label = "langgraph_integration"
    verbose_name = "LangGraph"

    def ready(self) -> None:
        from checkpoints.forks import register_fork_shaper
        from integrations.langgraph.forks import langgraph_fork

        # Dashboard forks work without LangGraph installed: the shaper needs no LangGraph import.
        register_fork_shaper(langgraph_fork)
