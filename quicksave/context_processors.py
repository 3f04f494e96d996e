"""Template context every dashboard page shares."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest

from quicksave.roles import ADMIN, REVIEWER, role_of


def dashboard(request: HttpRequest) -> dict[str, Any]:
    role = role_of(request.user) if hasattr(request, "user") else None
    return {
        "user_role": role,
        "pending_approvals": _pending(request) if role else 0,
        "can_review": role in (REVIEWER, ADMIN),
        "can_admin": role == ADMIN,
    }


def _pending(request: HttpRequest) -> int:
    from approvals.models import ApprovalRequest, ApprovalStatus
    from checkpoints.access import visible_threads

    pending = ApprovalRequest.objects.filter(status=ApprovalStatus.PENDING)
    return pending.filter(thread__in=visible_threads(request.user)).count()
