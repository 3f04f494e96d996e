"""Agent frameworks, one package each (django-storages' shape: one module set per backend behind
Quicksave's public surface). An integration imports Quicksave's domain modules, never the other
way round; each framework's own packages come from its optional requirements file."""
