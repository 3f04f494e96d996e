"""Agents (a named kind of agent) and the API keys that let one agent write its threads."""

from __future__ import annotations

from django.db import models


class Agent(models.Model):
    name = models.SlugField(max_length=64, unique=True)
    version = models.CharField(max_length=32, default="1")
    description = models.TextField(blank=True)
    state_schema = models.JSONField(null=True, blank=True, help_text="Optional JSON Schema for the state.")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class AgentKey(models.Model):
    """An API key scoped to one agent. Only a SHA-256 of the secret is kept."""

    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="keys")
    prefix = models.CharField(max_length=16, unique=True, help_text="Public part, shown in lists.")
    secret_hash = models.CharField(max_length=64)
    label = models.CharField(max_length=100, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.agent.name}:{self.prefix}"

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None
