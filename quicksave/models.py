"""Rows Quicksave keeps for itself rather than for a domain app: the failed-authentication counters."""

from __future__ import annotations

from django.db import models


class AuthFailureWindow(models.Model):
    """How many authentications failed from one address since `window_start` (see quicksave/throttle.py).

    One row per address, updated with an upsert, so every server process sees the same count.
    """

    address = models.CharField(max_length=64, primary_key=True)
    window_start = models.DateTimeField(db_index=True)
    failures = models.PositiveIntegerField()

    def __str__(self) -> str:
        return f"{self.address}: {self.failures} since {self.window_start:%H:%M:%S}"
