from django.urls import path

from quicksave_agents import api

urlpatterns = [
    path("runs/claim/", api.ClaimView.as_view(), name="api-runs-claim"),
    path("runs/<uuid:run_id>/heartbeat/", api.HeartbeatView.as_view(), name="api-run-heartbeat"),
    path("runs/<uuid:run_id>/complete/", api.CompleteView.as_view(), name="api-run-complete"),
    path("runs/<uuid:run_id>/fail/", api.FailView.as_view(), name="api-run-fail"),
    path("threads/<uuid:thread_id>/tool-calls/<str:key>/", api.ToolCallView.as_view(), name="api-tool-call"),
    path(
        "threads/<uuid:thread_id>/tool-calls/<str:key>/result/",
        api.ToolCallResultView.as_view(),
        name="api-tool-call-result",
    ),
]
