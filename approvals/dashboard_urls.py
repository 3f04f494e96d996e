"""The approval inbox pages."""

from django.urls import path

from approvals import views

app_name = "inbox"

urlpatterns = [
    path("", views.inbox, name="list"),
    path("bulk/", views.bulk_approve, name="bulk"),
    path("<uuid:approval_id>/", views.approval_detail, name="approval"),
]
