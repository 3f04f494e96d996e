"""The policy pages (admins only)."""

from django.urls import path

from approvals import policy_views

app_name = "policies"

urlpatterns = [
    path("", policy_views.policy_list, name="list"),
    path("new/", policy_views.policy_create, name="policy-create"),
    path("<int:policy_id>/", policy_views.policy_detail, name="policy"),
    path("<int:policy_id>/retire/", policy_views.policy_retire, name="policy-retire"),
    path("rules/new/", policy_views.rule_create, name="rule-create"),
    path("rules/<int:rule_id>/", policy_views.rule_detail, name="rule"),
    path("rules/<int:rule_id>/revoke/", policy_views.rule_revoke, name="rule-revoke"),
]
