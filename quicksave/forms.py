"""Form fields the dashboard's filter forms share."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django import forms
from django.core.exceptions import BadRequest
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
