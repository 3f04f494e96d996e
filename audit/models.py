"""The audit trail's one model."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone


class AuditEntry(models.Model):
    """An append-only record of a human action: who did what to which thing, why, and from where.

    Written only through audit.trail.record; never changed or deleted by the app (a trigger refuses).
    """

    actor = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.PROTECT, related_name="+")
    actor_name = models.CharField(max_length=150, help_text="Kept as written, even if the user is renamed.")
    action = models.CharField(max_length=64)
    target_type = models.CharField(max_length=64)
    target_id = models.CharField(max_length=64)
    thread = models.ForeignKey(
        "checkpoints.Thread", null=True, blank=True, on_delete=models.SET_NULL, related_name="audit_entries"
    )
    reason = models.TextField(blank=True)
    before = models.JSONField(default=dict, blank=True)
    after = models.JSONField(default=dict, blank=True)
    address = models.GenericIPAddressField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        # The table keeps the name it was created with in the approvals app: sealed values are
        # bound to it (their associated data names it) and its append-only trigger is named after it.
        db_table = "approvals_auditentry"
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["action", "-created_at"], name="audit_action"),
                   models.Index(fields=["thread", "-created_at"], name="audit_thread")]  # fmt: skip
        verbose_name_plural = "audit entries"

    def __str__(self) -> str:
        return f"{self.actor_name} {self.action} {self.target_type}:{self.target_id}"
