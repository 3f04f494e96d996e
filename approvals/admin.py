"""The Django admin shows the audit trail read-only: no add, change or delete, whoever asks."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.contrib import admin
from django.http import HttpRequest

from approvals.models import AuditEntry

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
    readonly_fields = tuple(field.name for field in AuditEntry._meta.fields)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
