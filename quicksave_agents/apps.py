from django.apps import AppConfig


class AgentsConfig(AppConfig):
    name = "quicksave_agents"
    # The package was renamed from `agents` (openai-agents owns that top-level name); the label
    # keeps tables, migrations, permissions and content types as they were.
    label = "agents"
    verbose_name = "Agents"
