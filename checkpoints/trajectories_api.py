"""API doors to the training exports (checkpoints/trajectories.py): fine-tuning JSONL and preference
pairs, streamed. Threads are scoped as the threads API scopes them: an agent key sees its own agent's."""

from __future__ import annotations

from typing import Any

from django.http import StreamingHttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.views import APIView

from checkpoints import trajectories
from checkpoints.access import visible_threads
from checkpoints.api import JSONLinesRenderer
from checkpoints.models import ThreadStatus


class ExportQuerySerializer(serializers.Serializer[Any]):
    agent = serializers.SlugField(required=False, max_length=64, help_text="Only the threads of this agent.")
    since = serializers.DateTimeField(required=False, help_text="Only the threads started at or after this time.")
    until = serializers.DateTimeField(required=False, help_text="Only the threads started before this time.")
    outcome = serializers.ChoiceField(required=False, choices=ThreadStatus.choices,
                                      help_text="Only the threads with this status.")  # fmt: skip


class PreferenceQuerySerializer(ExportQuerySerializer):
    rejections = serializers.ChoiceField(
        required=False, choices=["skip", "comment"], default="skip",
        help_text="A rejected action: `skip` leaves it out; `comment` pairs it with the reviewer's comment as the "
        "preferred output.",
    )  # fmt: skip


def _query(serializer_class: type[serializers.Serializer[Any]], request: Request) -> dict[str, Any]:
    serializer = serializer_class(data=request.query_params.dict())
    serializer.is_valid(raise_exception=True)
    return dict(serializer.validated_data)


def _filter(query: dict[str, Any]) -> trajectories.Filter:
    return trajectories.Filter(
        agent=query.get("agent"), since=query.get("since"), until=query.get("until"), outcome=query.get("outcome")
    )


def _streamed(lines: Any, name: str) -> StreamingHttpResponse:
    response = StreamingHttpResponse(lines, content_type=trajectories.CONTENT_TYPE)
    response["Content-Disposition"] = f'attachment; filename="{name}"'
    return response


class FineTuningExportView(APIView):
    """Fine-tuning JSONL (OpenAI chat format) of the matching threads you may read; threads whose state is
    not chat-shaped are left out."""

    renderer_classes = [JSONRenderer, JSONLinesRenderer]

    @extend_schema(
        parameters=[ExportQuerySerializer],
        responses={(200, trajectories.CONTENT_TYPE): OpenApiResponse(
            OpenApiTypes.STR, description='JSON Lines: `{"messages": [...], "tools": [...]}` per thread.'
        )},
    )  # fmt: skip
    def get(self, request: Request) -> StreamingHttpResponse:
        threads = _filter(_query(ExportQuerySerializer, request)).apply(visible_threads(request.user))
        return _streamed(trajectories.lines(trajectories.fine_tuning_records(threads)), "quicksave-fine-tuning.jsonl")


class PreferenceExportView(APIView):
    """Preference pairs (DPO JSONL) from the edited and rejected approvals on the matching threads you may read."""

    renderer_classes = [JSONRenderer, JSONLinesRenderer]

    @extend_schema(
        parameters=[PreferenceQuerySerializer],
        responses={(200, trajectories.CONTENT_TYPE): OpenApiResponse(
            OpenApiTypes.STR,
            description='JSON Lines: `{"input": {"messages": [...]}, "preferred_output": [...], '
            '"non_preferred_output": [...]}` per edited or rejected approval.',
        )},
    )  # fmt: skip
    def get(self, request: Request) -> StreamingHttpResponse:
        query = _query(PreferenceQuerySerializer, request)
        threads = _filter(query).apply(visible_threads(request.user))
        records = trajectories.preference_records(threads, rejections=query["rejections"])
        return _streamed(trajectories.lines(records), "quicksave-preferences.jsonl")
