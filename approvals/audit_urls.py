"""The audit page (admins only)."""

from django.urls import path

from approvals import audit_views

app_name = "audit"

urlpatterns = [
    path("", audit_views.audit_list, name="list"),
]
