"""The checkpoint page: the materialised state, its fields, tool results and integrity."""

from __future__ import annotations

from uuid import UUID

from django.http import HttpRequest, HttpResponse

from checkpoints.views import viewer_required


@viewer_required
def checkpoint_detail(request: HttpRequest, checkpoint_id: UUID) -> HttpResponse:
    raise NotImplementedError
