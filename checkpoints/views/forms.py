"""The dashboard's fork form: what the "Rewind & branch" card and page post, checked field by field.

The limits are the domain's (`checkpoints.forks`), so the page refuses what the API would, and
says which field is wrong and by how much; what needs the database (a taken branch name, a
decision that cannot be carried) is still checked by `forks.plan_fork` and shown on the field.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.core.validators import RegexValidator

from checkpoints.forks import BRANCH_NAME, REASON_MAX_CHARS
from quicksave.jsontext import loads_strict

STEPS = ("review", "edit", "confirm")


class ForkForm(forms.Form):
    """Review posts `reason`, `branch`, `resume`, `carry_approval` and, when edited, `state`;
    edit and confirm come from the confirmation page and carry the reviewed `patch` instead."""

    step = forms.ChoiceField(choices=[(step, step) for step in STEPS], required=False)
    reason = forms.CharField(
        max_length=REASON_MAX_CHARS,
        error_messages={
            "required": "Give a reason: the audit trail records why.",
            "max_length": "Keep the reason to %(limit_value)d characters (it has %(show_value)d).",
            "null_characters_not_allowed": "The reason cannot hold a NUL character.",
        },
    )
    branch = forms.CharField(
        required=False,
        max_length=100,
        validators=[
            RegexValidator(
                rf"\A(?:{BRANCH_NAME.pattern})\Z",
                "A branch name is 1 to 100 letters, digits, '.', '_', '-' or '/', starting with a letter or digit.",
            )
        ],
        error_messages={"max_length": "A branch name is at most %(limit_value)d characters (it has %(show_value)d)."},
    )
    resume = forms.BooleanField(required=False)
    carry_approval = forms.UUIDField(
        required=False, error_messages={"invalid": "Pick the decision to carry over from the list."}
    )
    # The edited state as JSON text; absent when the state was too large for the editor.
    state = forms.CharField(required=False, strip=False)
    # The reviewed changes (an RFC 6902 patch as JSON), carried by the confirmation page.
    patch = forms.CharField(required=False, strip=False)

    def clean_step(self) -> str:
        return str(self.cleaned_data["step"] or "review")

    def clean_branch(self) -> str | None:
        return str(self.cleaned_data["branch"]) or None

    def clean_state(self) -> dict[str, Any] | None:
        """The edited state, or None when the form had no editor (the state is forked as it is)."""
        if "state" not in self.data:
            return None
        try:
            edited = loads_strict(self.cleaned_data["state"])
        except ValueError as exc:
            raise forms.ValidationError(f"This is not valid JSON: {exc}") from None
        if not isinstance(edited, dict):
            raise forms.ValidationError("The state must be a JSON object ({…}).")
        return edited

    def clean_patch(self) -> list[dict[str, Any]] | None:
        """The reviewed patch, or None when it is missing or unreadable (the person reviews again)."""
        try:
            ops = loads_strict(self.cleaned_data["patch"])
        except ValueError:
            return None
        return ops if isinstance(ops, list) else None
