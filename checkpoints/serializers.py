"""Request shapes and response bodies of the checkpoints API (no domain logic here)."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from checkpoints.models import Branch, Checkpoint, CheckpointStatus, PayloadKind, Thread, ThreadStatus, ToolResult


class ModelParamsSerializer(serializers.Serializer[Any]):
    name = serializers.CharField(required=False, allow_null=True, max_length=200)
    version = serializers.CharField(required=False, allow_null=True, max_length=100)
    temperature = serializers.FloatField(required=False, allow_null=True)
    top_p = serializers.FloatField(required=False, allow_null=True)
    seed = serializers.IntegerField(required=False, allow_null=True)


class CheckpointSummarySerializer(serializers.Serializer[Checkpoint]):
    id = serializers.UUIDField()
    thread = serializers.UUIDField(source="thread_id")
    branch = serializers.SerializerMethodField()
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
    storage = serializers.SerializerMethodField()
    state_bytes = serializers.IntegerField()
    created_at = serializers.DateTimeField()

    def get_branch(self, checkpoint: Checkpoint) -> str:
        names: dict[int, str] = self.context.get("branch_names", {})
        return names.get(checkpoint.branch_id) or checkpoint.branch.name

    def get_storage(self, checkpoint: Checkpoint) -> str:
        return PayloadKind(checkpoint.kind).label


class CheckpointDetailSerializer(CheckpointSummarySerializer):
    state = serializers.SerializerMethodField()
    integrity = serializers.SerializerMethodField()

    def get_state(self, checkpoint: Checkpoint) -> dict[str, Any]:
        state: dict[str, Any] = self.context["state"]
        return state

    def get_integrity(self, checkpoint: Checkpoint) -> dict[str, str]:
        return {"status": "verified", "mac": bytes(checkpoint.integrity).hex()}


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
        names = {thread.active_branch_id: self.get_active_branch(thread)}
        return dict(CheckpointSummarySerializer(thread.head, context={"branch_names": names}).data)


class ThreadDetailSerializer(ThreadSerializer):
    branches = serializers.SerializerMethodField()

    def get_branches(self, thread: Thread) -> list[dict[str, Any]]:
        return list(BranchSerializer(thread.branches.all(), many=True, context=self.context).data)

    class Meta(ThreadSerializer.Meta):
        fields = [*ThreadSerializer.Meta.fields, "branches"]


class ThreadCreateSerializer(serializers.Serializer[Any]):
    agent = serializers.SlugField(required=False, max_length=64)
    external_id = serializers.CharField(required=False, allow_null=True, max_length=255)
    metadata = serializers.DictField(required=False)


class ThreadListQuerySerializer(serializers.Serializer[Any]):
    agent = serializers.SlugField(required=False, max_length=64)
    status = serializers.ChoiceField(required=False, choices=ThreadStatus.choices)
    step = serializers.IntegerField(required=False, min_value=0)
    since = serializers.DateTimeField(required=False)
    until = serializers.DateTimeField(required=False)
    q = serializers.ListField(child=serializers.CharField(max_length=1000), required=False)
    cursor = serializers.CharField(required=False)


class ToolResultInputSerializer(serializers.Serializer[Any]):
    key = serializers.CharField(max_length=128)
    tool = serializers.CharField(required=False, allow_blank=True, max_length=200)
    result = serializers.JSONField()


class CheckpointCreateSerializer(serializers.Serializer[Any]):
    parent = serializers.UUIDField(allow_null=True)  # type: ignore[assignment]
    state = serializers.DictField(required=False)
    patch = serializers.ListField(child=serializers.DictField(), required=False)
    branch = serializers.CharField(required=False, max_length=100)
    step = serializers.IntegerField(required=False, allow_null=True, min_value=0, max_value=2**31 - 1)
    label = serializers.CharField(required=False, allow_blank=True, max_length=200)  # type: ignore[assignment]
    status = serializers.ChoiceField(required=False, choices=CheckpointStatus.choices)
    model = ModelParamsSerializer(required=False)
    metadata = serializers.DictField(required=False)
    schema_version = serializers.IntegerField(required=False, min_value=1, max_value=2**31 - 1)
    tool_results = ToolResultInputSerializer(many=True, required=False)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if ("state" in attrs) == ("patch" in attrs):
            raise serializers.ValidationError(
                {"state": "Give exactly one of `state` (the full new state) or `patch` (RFC 6902 ops)."}
            )
        return attrs


class CheckpointListQuerySerializer(serializers.Serializer[Any]):
    branch = serializers.CharField(required=False, max_length=100)
    after_seq = serializers.IntegerField(required=False, min_value=0, default=0)
    limit = serializers.IntegerField(required=False, min_value=1, max_value=1000, default=100)


class DiffQuerySerializer(serializers.Serializer[Any]):
    base = serializers.UUIDField(required=False)


class ToolResultSerializer(serializers.ModelSerializer[ToolResult]):
    checkpoint = serializers.UUIDField(source="checkpoint_id", allow_null=True)

    class Meta:
        model = ToolResult
        fields = ["key", "tool", "result", "checkpoint", "created_at"]


class ToolResultPutSerializer(serializers.Serializer[Any]):
    result = serializers.JSONField()
    tool = serializers.CharField(required=False, allow_blank=True, max_length=200)
    checkpoint = serializers.UUIDField(required=False, allow_null=True)
