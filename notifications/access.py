"""Who may configure notifications: admins (the `notifications.change_endpoint` permission every
admin has). The one place the pages and the API ask."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied

from checkpoints.views import permission_required

MANAGE = "notifications.change_endpoint"
REFUSAL = "Configuring notifications needs the admin role."

manager_required = permission_required(MANAGE, REFUSAL)


def check_can_manage(principal: Any) -> User:
    """The person who may configure channels and send deliveries again; 403 for anyone else
    (agent keys included: notifications are for people)."""
    if not isinstance(principal, User) or not principal.has_perm(MANAGE):
        raise PermissionDenied(REFUSAL)
    return principal
