"""Form fields the dashboard's filter forms share."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Generic, TypeVar
from uuid import UUID

from django import forms
from django.core.exceptions import BadRequest
from django.http import HttpRequest
from django.utils import timezone


class DateTimeInRangeField(forms.DateTimeField):
    """A date and time that stays one in UTC and in the server's time zone: `0001-01-01T00:00+01:00`
    parses, but is in year 0 in UTC, which Python cannot represent (the page echoing it back, or
    the query, would fail)."""

    default_error_messages = {"out_of_range": "Enter a date and time between the years 1 and 9999."}

    def to_python(self, value: Any) -> datetime | None:
        parsed = super().to_python(value)
        if parsed is None:
            return None
        try:  # DateTimeField has made it aware already
            parsed.astimezone(UTC)
            timezone.localtime(parsed)
        except OverflowError:
            raise forms.ValidationError(self.error_messages["out_of_range"], code="out_of_range") from None
        return parsed


def invalid_filters(form: forms.Form) -> BadRequest:
    """The 400 for a page's filter form that did not validate, naming each field by the label its
    page shows and what is wrong with it."""
    problems = "; ".join(
        f"{form.fields[name].label or name.capitalize()}: {' '.join(map(str, errors))}"
        for name, errors in form.errors.items()
    )
    return BadRequest(f"Those filters do not work: {problems}")


Id = TypeVar("Id", UUID, int)


class PageLinkField(forms.CharField, Generic[Id]):
    """A keyset page link a list page made: the (time, id) of the last row shown before, as
    base64 of JSON. Cleans to that pair (None when absent); anything else is a broken link."""

    default_error_messages = {"broken": "This page link is broken; start again from the first page."}

    def __init__(self, *, id_type: Callable[[Any], Id], **kwargs: Any) -> None:
        kwargs.setdefault("required", False)
        kwargs.setdefault("max_length", 200)
        kwargs.setdefault("label", "Page link")
        super().__init__(**kwargs)
        self.id_type: Callable[[Any], Id] = id_type

    def clean(self, value: Any) -> tuple[datetime, Id] | None:
        raw = super().clean(value)
        if not raw:
            return None
        try:
            at, row_id = json.loads(base64.urlsafe_b64decode(raw.encode()).decode())
            if not isinstance(at, str) or type(row_id) is not (int if self.id_type is int else str):
                raise ValueError("not a link a page made")
            when = datetime.fromisoformat(at)
            if when.tzinfo is None:
                raise ValueError("a page link's time has its offset")
            # In UTC, as the pages write them: Python reads offsets PostgreSQL refuses (+23:59, seconds).
            return when.astimezone(UTC), self.id_type(row_id)
        except (ValueError, TypeError, OverflowError):
            raise forms.ValidationError(self.error_messages["broken"], code="broken") from None

    @staticmethod
    def link(at: datetime, row_id: UUID | int | str) -> str:
        """The page link that follows on from the row at (`at`, `row_id`)."""
        position = [at.isoformat(), row_id if isinstance(row_id, int) else str(row_id)]
        return base64.urlsafe_b64encode(json.dumps(position).encode()).decode()


def page_queries(request: HttpRequest, field: str, following: str | None) -> tuple[str, str | None]:
    """The query strings of a list page's first page and of the page after this one (None when this
    is the last): the page's own query with its page link `field` dropped, or set to `following`."""
    query = request.GET.copy()
    query.pop(field, None)
    first = query.urlencode()
    if following is None:
        return first, None
    query[field] = following
    return first, query.urlencode()
