from __future__ import annotations

from typing import Any

from django.apps import AppConfig
from django.contrib.admin import apps as admin_apps  # a module: its AdminConfig is no candidate here
from django.core.signals import request_finished
from django.db.models.signals import post_migrate

from quicksave import logs, telemetry


class QuicksaveConfig(AppConfig):
    name = "quicksave"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        post_migrate.connect(_sync_roles, dispatch_uid="quicksave.sync_roles")
        request_finished.connect(logs.forget_request, dispatch_uid="quicksave.logs.forget_request")
        # Before Django builds its middleware chain, so the Django instrumentation's is in it.
        telemetry.configure()


class QuicksaveAdminConfig(admin_apps.AdminConfig):
    """django.contrib.admin with the staff-only site (quicksave/adminsite.py)."""

    default = False
    default_site = "quicksave.adminsite.QuicksaveAdminSite"


def _sync_roles(sender: AppConfig, **kwargs: Any) -> None:
    """After every migrate, the role groups hold exactly the permissions quicksave/roles.py
    gives them, so an upgrade that adds a permission (delete_thread) reaches existing admins."""
    if sender.name != "quicksave":
        return
    from django.contrib.auth.models import Permission

    from quicksave.roles import ROLE_PERMISSIONS, ensure_roles

    wanted = {name.split(".")[1] for names in ROLE_PERMISSIONS.values() for name in names}
    if Permission.objects.using(kwargs.get("using", "default")).filter(codename__in=wanted).count() < len(wanted):
        return  # a partial migrate (tests, an app not migrated yet): nothing to sync against
    ensure_roles()
