"""The sign-in page: Django's LoginView with failed sign-ins throttled per address (quicksave/throttle.py),
sending someone who signs in with a temporary password on to choose their own (quicksave/people.py)."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.forms import AuthenticationForm
from django.contrib.auth.views import LoginView
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect

from audit.trail import client_address
from quicksave import people, throttle
from quicksave.people_views import PASSWORD_TO_SET, set_password_url


class ThrottledLoginView(LoginView):
    redirect_authenticated_user = True

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        # Checked before the password, so a right guess after the limit is refused like a wrong one.
        wait = throttle.retry_after(client_address(request))
        if wait is not None:
            return self._throttled(self.get_form(), wait)
        return super().post(request, *args, **kwargs)

    def form_valid(self, form: AuthenticationForm) -> HttpResponse:
        response = super().form_valid(form)  # signed in, in a new session
        if people.must_set_password(form.get_user()):
            self.request.session[PASSWORD_TO_SET] = True
            return redirect(set_password_url(self.get_success_url()))
        return response

    def form_invalid(self, form: AuthenticationForm) -> HttpResponse:
        wait = throttle.note_failure(client_address(self.request))
        if wait is not None:
            return self._throttled(form, wait)
        return super().form_invalid(form)

    def _throttled(self, form: AuthenticationForm, wait: int) -> HttpResponse:
        response = self.render_to_response(self.get_context_data(form=form, retry_after=wait), status=429)
        response["Retry-After"] = str(wait)
        return response
