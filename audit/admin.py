"""The Django admin shows the audit trail read-only: no add, change or delete, whoever asks."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from django.contrib import admin
from django.http import HttpRequest

from audit import trail
from audit.models import AuditEntry

if TYPE_CHECKING:  # ModelAdmin is generic only in django-stubs
    AuditEntryAdminBase = admin.ModelAdmin[AuditEntry]
else:
    AuditEntryAdminBase = admin.ModelAdmin


@admin.register(AuditEntry)
class AuditEntryAdmin(AuditEntryAdminBase):
    list_display = ("created_at", "actor_name", "action", "target_type", "target_id", "address")
    list_filter = ("action",)
    search_fields = ("actor_name", "target_id")
    date_hierarchy = "created_at"
    # before/after as a person reads them (sealed values opened while their thread lives), not as stored.
    exclude = ("before", "after")
    readonly_fields = (
        *(field.name for field in AuditEntry._meta.fields if field.name not in ("before", "after")),
        "opened_before",
        "opened_after",
    )

    @admin.display(description="before")
    def opened_before(self, entry: AuditEntry) -> str:
        return _json(trail.opened(entry).before)

    @admin.display(description="after")
    def opened_after(self, entry: AuditEntry) -> str:
        return _json(trail.opened(entry).after)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


def _json(values: dict[str, Any]) -> str:
    return json.dumps(values, ensure_ascii=False, sort_keys=True, default=str)
