from django.urls import path

from approvals import api, policies_api

urlpatterns = [
    path("threads/<uuid:thread_id>/approvals/", api.ThreadApprovalsView.as_view(), name="api-thread-approvals"),
    path("approvals/", api.ApprovalListView.as_view(), name="api-approvals"),
    path("approvals/<uuid:approval_id>/", api.ApprovalDetailView.as_view(), name="api-approval"),
    path("approvals/<uuid:approval_id>/decide/", api.DecideView.as_view(), name="api-approval-decide"),
    path("policies/", policies_api.PolicyListView.as_view(), name="api-policies"),
    path("policies/<int:policy_id>/", policies_api.PolicyDetailView.as_view(), name="api-policy"),
    path("policies/rules/", policies_api.RuleListView.as_view(), name="api-rules"),
    path("policies/rules/suggest/", policies_api.RuleSuggestView.as_view(), name="api-rule-suggest"),
    path("policies/rules/<int:rule_id>/", policies_api.RuleDetailView.as_view(), name="api-rule"),
    path("policies/rules/<int:rule_id>/revoke/", policies_api.RuleRevokeView.as_view(), name="api-rule-revoke"),
]
