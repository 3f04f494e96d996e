"""SealedJSONField: a JSON value stored encrypted under its thread's data key.

The models import this module and the storage engine imports the models, so this module imports
nothing of the engine: the engine's sealer is handed to it when the app is ready (`use_sealer`,
called by CheckpointsConfig.ready)."""

from __future__ import annotations

import json
from typing import Any, Protocol

from django.core.exceptions import ImproperlyConfigured
from django.db import models


class Sealer(Protocol):
    """Seals a JSON value bound to its row (associated data `ad`) and opens it again."""

    failure: type[Exception]  # what `open` raises for a value that does not open

    def seal(self, thread_id: Any, ad: bytes, value: Any) -> bytes: ...

    def open(self, thread_id: Any, ad: bytes, blob: bytes) -> Any: ...


_sealer: Sealer | None = None


def use_sealer(sealer: Sealer) -> None:
    global _sealer
    _sealer = sealer


def sealer() -> Sealer:
    if _sealer is None:
        raise ImproperlyConfigured("SealedJSONField has no sealer: is the checkpoints app installed?")
    return _sealer


def associated_data(name: str, *parts: Any) -> bytes:
    """`table.column/part/part…` as bytes: what a sealed value is bound to."""
    return "/".join([name, *(str(part) for part in parts)]).encode()


class _Sealed:
    """What a sealed attribute holds: the ciphertext as stored, the value, or both."""

    __slots__ = ("blob", "opened", "value")

    def __init__(self, *, blob: bytes | None, value: Any, opened: bool) -> None:
        self.blob, self.value, self.opened = blob, value, opened


class _SealedAttribute:
    """Opens the stored ciphertext on first read; a new value is sealed when the row is saved."""

    def __init__(self, field: SealedJSONField) -> None:
        self.field = field

    def __get__(self, instance: models.Model | None, owner: type) -> Any:
        if instance is None:
            return self
        held: _Sealed | None = instance.__dict__.get(self.field.attname)
        if held is None:
            return None
        if not held.opened:
            held.value, held.opened = self.field.open(instance, held.blob), True
        return held.value

    def __set__(self, instance: models.Model, value: Any) -> None:
        # Values from the database arrive as bytes; a JSON value is never bytes.
        if isinstance(value, (bytes, memoryview)):
            held = _Sealed(blob=bytes(value), value=None, opened=False)
        else:
            held = _Sealed(blob=None, value=value, opened=True)
        instance.__dict__[self.field.attname] = held


class SealedJSONField(models.BinaryField):  # type: ignore[type-arg]  # not subscriptable at run time
    """A JSON value kept as AES-256-GCM ciphertext under the row's thread data key.

    The associated data is the table, the column and the values of `bind` (attributes
    that identify the row), so a ciphertext copied into another row or column does not
    open. Reads decrypt lazily; a SQL NULL reads as None. Not queryable by content.
    """

    def __init__(self, *args: Any, bind: tuple[str, ...] = ("pk",), **kwargs: Any) -> None:
        self.bind = tuple(bind)
        super().__init__(*args, **kwargs)

    def deconstruct(self) -> Any:
        name, path, args, kwargs = super().deconstruct()
        kwargs["bind"] = self.bind
        return name, path, args, kwargs

    def contribute_to_class(self, cls: type[models.Model], name: str, private_only: bool = False) -> None:
        super().contribute_to_class(cls, name, private_only)
        setattr(cls, self.attname, _SealedAttribute(self))

    def associated_data(self, instance: models.Model) -> bytes:
        return associated_data(
            f"{instance._meta.db_table}.{self.column}", *(getattr(instance, name) for name in self.bind)
        )

    def seal(self, instance: models.Model, value: Any) -> bytes:
        return sealer().seal(instance.thread_id, self.associated_data(instance), value)  # type: ignore[attr-defined]

    def open(self, instance: models.Model, blob: bytes | None) -> Any:
        if blob is None:
            return None
        return sealer().open(instance.thread_id, self.associated_data(instance), blob)  # type: ignore[attr-defined]

    def pre_save(self, model_instance: models.Model, add: bool) -> Any:
        held: _Sealed | None = model_instance.__dict__.get(self.attname)
        if held is None or (held.opened and held.value is None and self.null):
            return None
        if held.opened:  # set, or read and perhaps changed in place: seal what is there now
            held.blob = self.seal(model_instance, held.value)
        return held.blob

    def value_from_object(self, obj: models.Model) -> Any:
        return getattr(obj, self.attname)

    def value_to_string(self, obj: models.Model) -> str:
        return json.dumps(self.value_from_object(obj))


def unreadable(instance: models.Model, *names: str) -> str:
    """Why the named sealed fields of `instance` do not open ("" when they all do): an altered row,
    or a thread data key that no longer unwraps. Pages and the API show such a row as unreadable
    instead of failing for everyone."""
    try:
        for name in names:
            getattr(instance, name)
    except sealer().failure as exc:
        return str(getattr(exc, "message", exc))
    return ""
