"""What the store refuses: the checks of a write's state or patch and of its recorded fields."""

from __future__ import annotations

import contextlib
import math
from typing import Any

from django.conf import settings

from checkpoints.models import (
    CheckpointSource,
    CheckpointStatus,
)
from checkpoints.storage import blobs, codec
from checkpoints.storage.errors import (
    InvalidPatch,
    InvalidState,
    StateTooLarge,
)
from checkpoints.storage.jsonpatch import (
    PatchError,
    PatchTooLarge,
    apply_patch,
    apply_validated,
    depth_bound,
    make_patch,
    validate_patch,
)
from checkpoints.storage.nodes import Node

MODEL_FIELDS = {
    "name": "model_name",
    "version": "model_version",
    "temperature": "temperature",
    "top_p": "top_p",
    "seed": "seed",
}


def next_state(
    parent: Node | None, *, state: dict[str, Any] | None, patch: list[dict[str, Any]] | None
) -> tuple[bytes, dict[str, Any], int]:
    """The delta from the parent's state as canonical JSON, the new state and its size, all checked."""
    base: dict[str, Any] = parent.state if parent else {}
    base_bytes = parent.state_bytes if parent else 2
    validated = None
    if patch is not None:
        try:
            validated = validate_patch(patch)
        except PatchError as exc:
            raise InvalidPatch(exc.message, detail=_patch_detail(exc)) from None
        ops = patch
    else:
        if not isinstance(state, dict):
            raise InvalidState("`state` must be a JSON object.", detail={"field": "state"})
        ops = make_patch(base, state)
    # A round trip through canonical JSON rejects NaN/Infinity and bad Unicode, and
    # gives the store private copies of the inserted values, which a caller can no
    # longer mutate under the cache.
    try:
        delta, plain = codec.to_canonical_bytes_plain(ops)
    except codec.EncodingError as exc:
        field = "patch" if patch is not None else "state"
        raise InvalidState(f"The {field} {exc}.", detail={"field": field}) from None
    if blobs.MARKER_BYTES in delta:
        field = "patch" if patch is not None else "state"
        raise InvalidState(
            f"The {field} contains `{blobs.MARKER}`, which Quicksave keeps for its references to large values.",
            detail={"field": field},
        )
    ops = codec.loads(delta, plain=plain)
    max_bytes: int = settings.QUICKSAVE_MAX_STATE_BYTES
    limit: int = settings.QUICKSAVE_MAX_DEPTH
    try:
        growth = max_bytes - base_bytes
        # A patch's pointers were parsed when it was checked: its copy read back has the same ones.
        # Its plain values are sized by orjson, and a patch with too few brackets to nest the
        # state past the limit is not walked for its depth (a put's patch: a dozen at most).
        if validated is None:
            applied = apply_patch(base, ops, limit=growth)
        else:
            bound = depth_bound(validated, delta)
            applied = apply_validated(
                base, validated, ops, limit=growth, plain=plain, depth=bound is None or bound > limit
            )
    except PatchError as exc:
        raise InvalidPatch(exc.message, detail=_patch_detail(exc)) from None
    except PatchTooLarge as exc:
        raise StateTooLarge.stopped(exc, field="patch" if patch is not None else "state", limit=max_bytes) from None
    except RecursionError:
        raise InvalidState(f"The state is nested deeper than {settings.QUICKSAVE_MAX_DEPTH} levels.") from None
    if not isinstance(applied.doc, dict):
        raise InvalidState("The state must remain a JSON object.", detail={"field": "patch" if patch else "state"})
    if applied.depth > limit:
        raise InvalidState(
            f"The state is nested {applied.depth} levels deep; the limit is {limit}.",
            detail={"field": "patch" if patch is not None else "state", "limit": limit},
        )
    state_bytes = base_bytes + applied.size_delta
    if state_bytes > max_bytes:
        raise StateTooLarge(
            f"The state would be {state_bytes} bytes; the limit is {max_bytes} bytes (QUICKSAVE_MAX_STATE_BYTES).",
            detail={"field": "patch" if patch is not None else "state", "size": state_bytes, "limit": max_bytes},
        )
    return delta, applied.doc, state_bytes


def _patch_detail(exc: PatchError) -> dict[str, Any]:
    return {"field": "patch", "op": exc.index, "path": exc.path}


def checked_object(value: Any, *, field: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InvalidState(f"`{field}` must be a JSON object.", detail={"field": field})
    if not value:  # most writes carry no metadata
        return value
    try:
        canonical = codec.to_canonical_bytes(value)
        codec.check_depth(value, canonical=canonical)
        size = len(canonical)
    except codec.EncodingError as exc:
        raise InvalidState(f"`{field}` {exc}.", detail={"field": field}) from None
    limit: int = settings.QUICKSAVE_MAX_METADATA_BYTES
    if size > limit:
        raise InvalidState(
            f"`{field}` is {size} bytes of JSON; the limit is {limit} bytes (QUICKSAVE_MAX_METADATA_BYTES).",
            detail={"field": field, "size": size, "limit": limit},
        )
    return value


# Choices' .values builds a new list on every access; a write checks both.
# Each value to itself: looked up with any str or str enum member equal to it, they give the plain str.
_STATUSES = {value: value for value in CheckpointStatus.values}
_SOURCES = {value: value for value in CheckpointSource.values}


def checked_fields(
    *,
    step: int | None,
    label: str,
    status: str,
    model: dict[str, Any] | None,
    metadata: dict[str, Any] | None,
    schema_version: int,
    source: str,
) -> dict[str, Any]:
    def bad(field: str, message: str) -> InvalidState:
        return InvalidState(f"`{field}` {message}", detail={"field": field})

    if step is not None and (isinstance(step, bool) or not isinstance(step, int) or not 0 <= step < 2**31):
        raise bad("step", "must be an integer between 0 and 2147483647.")
    if not isinstance(label, str) or len(label) > 200:
        raise bad("label", "must be a string of at most 200 characters.")
    if status not in _STATUSES:
        raise bad("status", f"must be one of {', '.join(CheckpointStatus.values)}.")
    if source not in _SOURCES:
        raise bad("source", f"must be one of {', '.join(CheckpointSource.values)}.")
    if isinstance(schema_version, bool) or not isinstance(schema_version, int) or not 1 <= schema_version < 2**31:
        raise bad("schema_version", "must be a positive integer.")
    fields: dict[str, Any] = {
        # Plain strs, not the enum members the defaults are: the MAC's fields encode faster.
        "step": step, "label": label, "status": _STATUSES[status], "source": _SOURCES[source],
        "schema_version": schema_version,
        "metadata": checked_object(metadata or {}, field="metadata"),
        "model_name": "", "model_version": "", "temperature": None, "top_p": None, "seed": None,
    }  # fmt: skip
    if "environment" in fields["metadata"]:
        check_environment(fields["metadata"]["environment"])
    if model is not None:
        if not isinstance(model, dict):
            raise bad("model", "must be an object with name, version, temperature, top_p, seed.")
        unknown = set(model) - set(MODEL_FIELDS)
        if unknown:
            raise bad("model", f"has unknown keys {sorted(unknown)}; allowed: {sorted(MODEL_FIELDS)}.")
        for key in ("name", "version"):
            value = model.get(key)
            if value is not None and (not isinstance(value, str) or len(value) > (200 if key == "name" else 100)):
                raise bad(f"model.{key}", "must be a short string.")
            fields[MODEL_FIELDS[key]] = value or ""
        for key in ("temperature", "top_p"):
            fields[MODEL_FIELDS[key]] = _finite_float(model.get(key), field=f"model.{key}")
        seed = model.get("seed")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or abs(seed) >= 2**63):
            raise bad("model.seed", "must be a 64-bit integer.")
        fields["seed"] = seed
    return fields


def _finite_float(value: Any, *, field: str) -> float | None:
    """`value` as the double PostgreSQL stores (None stays None), refusing what is no number or
    none a double holds: NaN, an infinity, an integer of 309 digits or more."""
    if value is None:
        return None
    number = None
    if not isinstance(value, bool) and isinstance(value, (int, float)):
        with contextlib.suppress(OverflowError):
            number = float(value)
    if number is None or not math.isfinite(number):
        raise InvalidState(f"`{field}` must be a finite number.", detail={"field": field})
    return number


# Environment references (`metadata.environment`): what the world looked like when a checkpoint
# was written, so a resume from it can check the world still matches (quicksave_agents.runtime,
# the SDK's `serve`). Each is {"kind", "locator", "digest"}: a git repository and commit, an
# image and its digest, an object URL and its version or checksum, a database and a snapshot id.
ENVIRONMENT_KINDS = ("git", "image", "object", "file", "snapshot")
MAX_REFERENCES = 50
MAX_LOCATOR = 2000
MAX_DIGEST = 200


def check_environment(value: Any) -> None:
    """Refuse `metadata.environment` unless it is a list of at most MAX_REFERENCES references,
    each naming the field and the limit it breaks."""
    field = "metadata.environment"
    if not isinstance(value, list) or len(value) > MAX_REFERENCES:
        raise InvalidState(f"`{field}` must be a list of at most {MAX_REFERENCES} references "
                           '({"kind", "locator", "digest"}).', detail={"field": field})  # fmt: skip
    for index, reference in enumerate(value):
        at = f"{field}[{index}]"
        if not isinstance(reference, dict) or set(reference) != {"kind", "locator", "digest"}:
            raise InvalidState(f"`{at}` must be an object with exactly `kind`, `locator` and `digest`.",
                               detail={"field": at})  # fmt: skip
        if reference["kind"] not in ENVIRONMENT_KINDS:
            raise InvalidState(f"`{at}.kind` must be one of {', '.join(ENVIRONMENT_KINDS)}.",
                               detail={"field": f"{at}.kind"})  # fmt: skip
        for key, limit in (("locator", MAX_LOCATOR), ("digest", MAX_DIGEST)):
            text = reference[key]
            if not isinstance(text, str) or not text.strip() or len(text) > limit:
                raise InvalidState(f"`{at}.{key}` must be a non-empty string of at most {limit} characters.",
                                   detail={"field": f"{at}.{key}", "limit": limit})  # fmt: skip
