"""The diff page between any two checkpoints of a thread."""

from __future__ import annotations

from uuid import UUID

from django.http import HttpRequest, HttpResponse

from checkpoints.views import viewer_required


@viewer_required
def diff_page(request: HttpRequest, checkpoint_id: UUID) -> HttpResponse:
    raise NotImplementedError
