"""The audit page (admins only)."""

from django.urls import path

from audit import views

app_name = "audit"

urlpatterns = [
    path("", views.audit_list, name="list"),
]
