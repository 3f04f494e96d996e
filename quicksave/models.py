"""Rows Quicksave keeps for itself rather than for a domain app: the failed-authentication counters
and who must choose a password at their next sign-in."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone


class AuthFailureWindow(models.Model):
    """How many authentications failed from one address since `window_start` (see quicksave/throttle.py).

    One row per address, updated with an upsert, so every server process sees the same count.
    """

    address = models.CharField(max_length=64, primary_key=True)
    window_start = models.DateTimeField(db_index=True)
    failures = models.PositiveIntegerField()

    def __str__(self) -> str:
        return f"{self.address}: {self.failures} since {self.window_start:%H:%M:%S}"


class PasswordToSet(models.Model):
    """A person who must choose their own password when they next sign in: an admin created them,
    or gave them a temporary password. The row goes when they choose one (quicksave/people.py)."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, primary_key=True, on_delete=models.CASCADE, related_name="+")
    since = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"user {self.pk} must set a password (since {self.since:%Y-%m-%d %H:%M})"
