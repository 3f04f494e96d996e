"""Template context every dashboard page shares."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest

from quicksave.roles import ADMIN, REVIEWER, role_of


def dashboard(request: HttpRequest) -> dict[str, Any]:
    role = role_of(request.user) if hasattr(request, "user") else None
    return {
        "user_role": role,
        "can_review": role in (REVIEWER, ADMIN),
        "can_admin": role == ADMIN,
    }
