"""Template context every dashboard page shares."""

from __future__ import annotations

from functools import cache, partial
from typing import Any

from django.http import HttpRequest

from quicksave.roles import ADMIN, REVIEWER, role_of


def dashboard(request: HttpRequest) -> dict[str, Any]:
    role = role_of(request.user) if hasattr(request, "user") else None
    return {
        "user_role": role,
        # The nav's count, a callable the template calls when it shows it (once: cached), so a
        # page that counts it with its own figures (the inbox) passes the number and saves the query.
        "pending_approvals": cache(partial(_pending, request)) if role else 0,
        "can_review": role in (REVIEWER, ADMIN),
        "can_admin": role == ADMIN,
    }


def _pending(request: HttpRequest) -> int:
    from approvals.models import ApprovalRequest, ApprovalStatus
    from checkpoints.access import of_visible_threads

    pending = ApprovalRequest.objects.filter(status=ApprovalStatus.PENDING)
    return of_visible_threads(pending, request.user).count()
