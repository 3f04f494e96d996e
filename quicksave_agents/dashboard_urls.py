"""The agents page (admins only)."""

from django.urls import path, re_path

from quicksave_agents import views

app_name = "agents"

urlpatterns = [
    path("", views.agent_list, name="list"),
    path("keys/", views.key_create, name="key-create"),
    # A prefix is hex (quicksave_agents.keys.create_agent_key): anything else names no key, and a NUL would
    # reach PostgreSQL, whose text cannot hold one.
    re_path(r"^keys/(?P<prefix>[0-9a-f]{1,16})/revoke/$", views.key_revoke, name="key-revoke"),
]
