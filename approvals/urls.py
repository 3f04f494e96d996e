from django.urls import path

from approvals import api

urlpatterns = [
    path("threads/<uuid:thread_id>/approvals/", api.ThreadApprovalsView.as_view(), name="api-thread-approvals"),
    path("approvals/", api.ApprovalListView.as_view(), name="api-approvals"),
    path("approvals/<uuid:approval_id>/", api.ApprovalDetailView.as_view(), name="api-approval"),
    path("approvals/<uuid:approval_id>/decide/", api.DecideView.as_view(), name="api-approval-decide"),
]
