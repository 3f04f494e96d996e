"""The agents page (admins only)."""

from django.urls import path

from agents import views

app_name = "agents"

urlpatterns = [
    path("", views.agent_list, name="list"),
    path("keys/", views.key_create, name="key-create"),
    path("keys/<str:prefix>/revoke/", views.key_revoke, name="key-revoke"),
]
