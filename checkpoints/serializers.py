"""Request shapes and response bodies of the checkpoints API (no domain logic here)."""

from __future__ import annotations

import uuid
from typing import Any

from rest_framework import serializers

from checkpoints.models import Branch, Checkpoint, CheckpointStatus, PayloadKind, Thread, ThreadStatus, ToolResult
from quicksave.api import FenceField, StrictSerializer, parse_fence


class ModelParamsSerializer(serializers.Serializer[Any]):
    name = serializers.CharField(required=False, allow_null=True, max_length=200)
    version = serializers.CharField(required=False, allow_null=True, max_length=100)
    temperature = serializers.FloatField(required=False, allow_null=True)
    top_p = serializers.FloatField(required=False, allow_null=True)
    seed = serializers.IntegerField(required=False, allow_null=True)


def checkpoint_summary(checkpoint: Checkpoint, branch: str) -> dict[str, Any]:
    """A checkpoint's summary as the API returns it (the schema is CheckpointSummarySerializer).

    Built by hand: agents post checkpoints many times a second, and a DRF
    serializer costs more than the database write.
    """
    return {
        "id": str(checkpoint.id),
        "thread": str(checkpoint.thread_id),
        "branch": branch,
        "parent": str(checkpoint.parent_id) if checkpoint.parent_id else None,
        "seq": checkpoint.seq,
        "step": checkpoint.step,
        "label": checkpoint.label,
        "status": checkpoint.status,
        "source": checkpoint.source,
        "model": checkpoint.model,
        "metadata": checkpoint.metadata,
        "schema_version": checkpoint.schema_version,
        "storage": PayloadKind(checkpoint.kind).label,
        "state_bytes": checkpoint.state_bytes,
        "created_at": checkpoint.created_at.isoformat().replace("+00:00", "Z"),
    }


class CheckpointSummarySerializer(serializers.Serializer[Checkpoint]):
    """The schema of `checkpoint_summary` for the OpenAPI document (a test keeps the two in step)."""

    id = serializers.UUIDField()
    thread = serializers.UUIDField(source="thread_id")
    branch = serializers.CharField()
    # DRF collects declared fields off the class, so names that shadow Field attributes are fine.
    parent = serializers.UUIDField(source="parent_id", allow_null=True)  # type: ignore[assignment]
    seq = serializers.IntegerField()
    step = serializers.IntegerField(allow_null=True)
    label = serializers.CharField()  # type: ignore[assignment]
    status = serializers.ChoiceField(choices=CheckpointStatus.choices)
    source = serializers.CharField()  # type: ignore[assignment]
    model = ModelParamsSerializer()
    metadata = serializers.JSONField()
    schema_version = serializers.IntegerField()
    storage = serializers.ChoiceField(choices=["snapshot", "delta"])
    state_bytes = serializers.IntegerField()
    created_at = serializers.DateTimeField()


class CheckpointDetailSerializer(CheckpointSummarySerializer):
    """The schema of GET /checkpoints/{id}/ (CheckpointDetailView builds the body)."""

    state = serializers.DictField()
    integrity = serializers.DictField(child=serializers.CharField(), help_text="{status, mac}")


class BranchSerializer(serializers.ModelSerializer[Branch]):
    head = serializers.SerializerMethodField()
    head_seq = serializers.SerializerMethodField()
    fork_point = serializers.UUIDField(source="fork_point_id", allow_null=True)

    class Meta:
        model = Branch
        fields = ["name", "head", "head_seq", "fork_point", "created_at"]

    def _head(self, branch: Branch) -> tuple[Any, int] | None:
        heads: dict[int, tuple[Any, int]] = self.context.get("heads", {})
        return heads.get(branch.pk)

    def get_head(self, branch: Branch) -> str | None:
        head = self._head(branch)
        return str(head[0]) if head else None

    def get_head_seq(self, branch: Branch) -> int:
        head = self._head(branch)
        return head[1] if head else 0


class ThreadSerializer(serializers.ModelSerializer[Thread]):
    agent = serializers.CharField(source="agent.name")
    active_branch = serializers.SerializerMethodField()
    head = serializers.SerializerMethodField()

    class Meta:
        model = Thread
        fields = ["id", "agent", "external_id", "status", "step", "metadata", "active_branch", "head",
                  "created_at", "updated_at"]  # fmt: skip

    def get_active_branch(self, thread: Thread) -> str | None:
        return thread.active_branch.name if thread.active_branch_id and thread.active_branch else None

    def get_head(self, thread: Thread) -> dict[str, Any] | None:
        if thread.head_id is None or thread.head is None:
            return None
        return checkpoint_summary(thread.head, self.get_active_branch(thread) or "")


class ThreadDetailSerializer(ThreadSerializer):
    branches = serializers.SerializerMethodField()

    def get_branches(self, thread: Thread) -> list[dict[str, Any]]:
        return list(BranchSerializer(thread.branches.all(), many=True, context=self.context).data)

    class Meta(ThreadSerializer.Meta):
        fields = [*ThreadSerializer.Meta.fields, "branches"]


class ThreadCreateSerializer(StrictSerializer):
    agent = serializers.SlugField(required=False, max_length=64)
    external_id = serializers.CharField(required=False, allow_null=True, max_length=255)
    metadata = serializers.DictField(required=False)
    started_by = serializers.CharField(
        required=False, max_length=150,
        help_text="The user name of the person the agent runs this thread for (agent keys only; a person "
                  "creating a thread starts it as themselves). An approval policy may keep them from "
                  "approving its requests.",
    )  # fmt: skip


class ThreadListQuerySerializer(serializers.Serializer[Any]):
    agent = serializers.SlugField(
        required=False, max_length=64, help_text="Only the threads of the agent of this name."
    )
    status = serializers.ChoiceField(required=False, choices=ThreadStatus.choices,
                                     help_text="Only the threads with this status.")  # fmt: skip
    step = serializers.IntegerField(required=False, min_value=0, max_value=2**31 - 1,
                                    help_text="Only the threads at this step.")  # fmt: skip
    since = serializers.DateTimeField(required=False, help_text="Only the threads updated at or after this time.")
    until = serializers.DateTimeField(required=False, help_text="Only the threads updated before this time.")
    q = serializers.ListField(
        child=serializers.CharField(max_length=1000), required=False,
        help_text='Metadata the thread must contain: `key:value` or a JSON object such as `{"region": "eu"}`; '
        "repeat it to require several.",
    )  # fmt: skip
    cursor = serializers.CharField(
        required=False, help_text="The `next` URL's cursor: the page after the previous one."
    )


_CHECKPOINT_FIELDS: dict[str, tuple[type, ...]] = {
    "parent": (str, type(None)),
    "state": (dict,),
    "patch": (list,),
    "branch": (str,),
    "step": (int, type(None)),
    "label": (str,),
    "status": (str,),
    "model": (dict, type(None)),
    "metadata": (dict, type(None)),
    "schema_version": (int,),
    "tool_results": (list, type(None)),
    "fence": (str, type(None)),
}
_JSON_TYPE_NAMES = {str: "a string", dict: "an object", list: "an array", int: "an integer", type(None): "null"}


def parse_checkpoint_body(data: Any) -> dict[str, Any]:
    """Check the JSON types of a checkpoint POST (documented by CheckpointCreateSerializer).

    Ranges, choices and lengths are the store's to check; this only makes sure
    every field has the JSON type the store expects, with a precise 400 if not.
    Hand-written because agents post checkpoints many times a second.
    """
    if not isinstance(data, dict):
        raise serializers.ValidationError({"non_field_errors": "The body must be a JSON object."})
    unknown = sorted(set(data) - set(_CHECKPOINT_FIELDS))
    if unknown:
        raise serializers.ValidationError(
            {unknown[0]: f"is not a checkpoint field; the fields are {', '.join(_CHECKPOINT_FIELDS)}."}
        )
    if "parent" not in data:
        raise serializers.ValidationError({"parent": "This field is required (null for the first checkpoint)."})
    for name, value in data.items():
        allowed = _CHECKPOINT_FIELDS[name]
        if not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed):
            expected = " or ".join(_JSON_TYPE_NAMES[kind] for kind in allowed)
            raise serializers.ValidationError({name: f"must be {expected}."})
    if ("state" in data) == ("patch" in data):
        raise serializers.ValidationError(
            {"state": "Give exactly one of `state` (the full new state) or `patch` (RFC 6902 ops)."}
        )
    if data["parent"] is not None:
        try:
            data["parent"] = uuid.UUID(data["parent"])
        except ValueError:
            raise serializers.ValidationError({"parent": "must be a checkpoint id (a UUID) or null."}) from None
    data["fence"] = parse_fence(data.get("fence"))
    return data


class CheckpointCreateSerializer(serializers.Serializer[Any]):
    """The body of POST /threads/{id}/checkpoints/, for the OpenAPI document (see parse_checkpoint_body)."""

    parent = serializers.UUIDField(allow_null=True)  # type: ignore[assignment]
    state = serializers.DictField(required=False)
    patch = serializers.ListField(child=serializers.DictField(), required=False)
    branch = serializers.CharField(required=False, max_length=100)
    step = serializers.IntegerField(required=False, allow_null=True, min_value=0, max_value=2**31 - 1)
    label = serializers.CharField(required=False, allow_blank=True, max_length=200)  # type: ignore[assignment]
    status = serializers.ChoiceField(required=False, choices=CheckpointStatus.choices)
    # The store checks the model's keys and types and each tool result's shape.
    model = serializers.DictField(required=False, help_text="name, version, temperature, top_p, seed")
    metadata = serializers.DictField(required=False)
    schema_version = serializers.IntegerField(required=False, min_value=1, max_value=2**31 - 1)
    tool_results = serializers.ListField(
        child=serializers.DictField(), required=False, help_text="[{key, tool?, result}], stored with the checkpoint"
    )
    fence = FenceField()

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if ("state" in attrs) == ("patch" in attrs):
            raise serializers.ValidationError(
                {"state": "Give exactly one of `state` (the full new state) or `patch` (RFC 6902 ops)."}
            )
        return attrs


class CheckpointListQuerySerializer(serializers.Serializer[Any]):
    branch = serializers.CharField(required=False, max_length=100,
                                   help_text="The branch to list (default: the thread's active branch).")  # fmt: skip
    after_seq = serializers.IntegerField(
        required=False, min_value=0, max_value=2**31 - 1, default=0,
        help_text="Only the checkpoints after this position on the branch.",
    )  # fmt: skip
    limit = serializers.IntegerField(required=False, min_value=1, max_value=1000, default=100,
                                     help_text="How many checkpoints a page holds, 1 to 1000.")  # fmt: skip


class DiffQuerySerializer(serializers.Serializer[Any]):
    base = serializers.UUIDField(required=False)


class ValueHistoryQuerySerializer(serializers.Serializer[Any]):
    """The query of GET /threads/{id}/history/."""

    path = serializers.CharField(
        allow_blank=True, trim_whitespace=False, max_length=4000,
        help_text="RFC 6901 JSON pointer of the value, e.g. `/config/batch_size` (empty: the whole state).",
    )  # fmt: skip
    limit = serializers.IntegerField(
        required=False, default=50, min_value=1, max_value=200, help_text="Changes per page (1 to 200, default 50)."
    )
    cursor = serializers.CharField(required=False, help_text="The `next` link's cursor, for the following page.")


class ValueChangeSerializer(serializers.Serializer[Any]):
    """One change in a value's history (ValueHistoryView builds the body)."""

    checkpoint = serializers.UUIDField(help_text="The checkpoint whose change this is.")
    parent = serializers.UUIDField(allow_null=True, help_text="Its parent: the diff's base.")  # type: ignore[assignment]
    branch = serializers.CharField()
    seq = serializers.IntegerField()
    step = serializers.IntegerField(allow_null=True)
    label = serializers.CharField()  # type: ignore[assignment]
    status = serializers.ChoiceField(choices=CheckpointStatus.choices)
    created_at = serializers.DateTimeField()
    change = serializers.ChoiceField(
        choices=["added", "removed", "changed"],
        help_text="`added`: the path did not exist before (`old` is null); `removed`: it no longer exists "
        "(`new` is null); `changed`: both exist and differ.",
    )
    old = serializers.JSONField(allow_null=True, help_text="The value in the parent's state.")
    new = serializers.JSONField(allow_null=True, help_text="The value in this checkpoint's state.")
    omitted = serializers.ListField(
        child=serializers.ChoiceField(choices=["old", "new"]),
        help_text="Sides left out (null above) because the value is larger than 64 KB of JSON; read them from "
        "the checkpoint's state.",
    )


class ToolResultSerializer(serializers.ModelSerializer[ToolResult]):
    result = serializers.JSONField(read_only=True)
    checkpoint = serializers.UUIDField(source="checkpoint_id", allow_null=True)

    class Meta:
        model = ToolResult
        fields = ["key", "tool", "result", "checkpoint", "created_at"]


class ToolResultPutSerializer(StrictSerializer):
    result = serializers.JSONField(allow_null=True)
    tool = serializers.CharField(required=False, allow_blank=True, max_length=200)
    checkpoint = serializers.UUIDField(required=False, allow_null=True)


class ForkSerializer(StrictSerializer):
    """The body of POST /checkpoints/{id}/fork/ (the domain checks the patch and the names)."""

    reason = serializers.CharField(max_length=2000, help_text="Why: recorded in the audit trail and the label.")
    patch = serializers.JSONField(
        required=False, allow_null=True, help_text="RFC 6902 ops against the checkpoint's state (edit it first)."
    )
    resume = serializers.BooleanField(required=False, default=False, help_text="Continue the agent from the fork.")
    branch = serializers.CharField(
        required=False, allow_blank=True, allow_null=True, max_length=100,
        help_text="The new branch's name (default: fork-N, unique in the thread).",
    )  # fmt: skip
    carry_approval = serializers.UUIDField(
        required=False, allow_null=True,
        help_text="A decided approval of this thread whose decision the resumed agent gets instead of asking again.",
    )  # fmt: skip


class ForkResultSerializer(CheckpointSummarySerializer):
    """A fork's answer: the new checkpoint's summary plus the queued run, if the agent resumes."""

    run = serializers.UUIDField(allow_null=True)


class ThreadActionSerializer(StrictSerializer):
    """The body of POST /threads/{id}/cancel/ and /resume/."""

    reason = serializers.CharField(max_length=2000, help_text="Why: recorded in the audit trail.")


class ThreadActionResultSerializer(ThreadDetailSerializer):
    """Schema only: the view adds the queued run's id to the thread."""

    run = serializers.UUIDField(allow_null=True, read_only=True)

    class Meta(ThreadDetailSerializer.Meta):
        fields = [*ThreadDetailSerializer.Meta.fields, "run"]
