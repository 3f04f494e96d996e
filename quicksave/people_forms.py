"""The forms of the people pages: each error is put on the field it is about, in words naming it."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib.auth import password_validation
from django.contrib.auth.models import User

from quicksave.roles import ADMIN, REVIEWER, ROLES, VIEWER, username_problem

ROLE_CHOICES = [
    (VIEWER, "Viewer: reads threads, checkpoints and the inbox"),
    (REVIEWER, "Reviewer: also approves and rejects"),
    (ADMIN, "Admin: also rewinds, cancels, manages keys, policies and people"),
]
assert [value for value, _ in ROLE_CHOICES] == list(ROLES)
REASON_CHARS = 500


class NewPersonForm(forms.Form):
    username = forms.CharField(label="User name", max_length=150)
    email = forms.EmailField(label="Email (optional)", required=False, max_length=254)
    role = forms.ChoiceField(label="Role", choices=ROLE_CHOICES, initial=VIEWER)
    password = forms.CharField(
        label="Temporary password (optional)",
        required=False,
        max_length=128,
        strip=False,
        widget=forms.PasswordInput(attrs={"autocomplete": "new-password"}),
        help_text="Leave empty and Quicksave makes one up. Either way it is shown once, and they choose "
        "their own when they first sign in.",
    )

    invite = forms.BooleanField(
        label="Email them an invitation", required=False,
        help_text="Where to sign in and their user name (not the password: give them that yourself).",
    )  # fmt: skip

    def clean_username(self) -> str:
        name: str = self.cleaned_data["username"].strip()
        if problem := username_problem(name):
            raise forms.ValidationError(f"User name: {problem}")
        if User.objects.filter(username__iexact=name).exists():
            raise forms.ValidationError(f"User name: someone is already called {name!r} (names ignore case).")
        return name

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if data.get("invite") and not data.get("email") and "email" not in self.errors:
            self.add_error("email", "Email: give an address to send the invitation to.")
        password = data.get("password")
        if password:
            candidate = User(username=data.get("username", ""), email=data.get("email", ""))
            try:
                password_validation.validate_password(password, candidate)
            except forms.ValidationError as exc:
                self.add_error("password", [f"Temporary password: {message}" for message in exc.messages])
        return data


class RoleForm(forms.Form):
    role = forms.ChoiceField(label="Role", choices=ROLE_CHOICES)


class ReasonForm(forms.Form):
    """The optional reason a deactivation records in the audit trail."""

    reason = forms.CharField(label="Reason (optional, for the audit trail)", required=False, max_length=REASON_CHARS)
