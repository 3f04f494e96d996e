from django.urls import path

from checkpoints import api, trajectories_api

urlpatterns = [
    path("threads/", api.ThreadListView.as_view(), name="api-threads"),
    path("threads/<uuid:thread_id>/", api.ThreadDetailView.as_view(), name="api-thread"),
    path("threads/<uuid:thread_id>/checkpoints/", api.CheckpointListView.as_view(), name="api-checkpoints"),
    path("threads/<uuid:thread_id>/history/", api.ValueHistoryView.as_view(), name="api-thread-history"),
    path("threads/<uuid:thread_id>/export/", api.ThreadExportView.as_view(), name="api-thread-export"),
    path("threads/<uuid:thread_id>/tool-results/<str:key>/", api.ToolResultView.as_view(), name="api-tool-result"),
    path("checkpoints/<uuid:checkpoint_id>/", api.CheckpointDetailView.as_view(), name="api-checkpoint"),
    path("checkpoints/<uuid:checkpoint_id>/diff/", api.CheckpointDiffView.as_view(), name="api-checkpoint-diff"),
    path("checkpoints/<uuid:checkpoint_id>/fork/", api.ForkView.as_view(), name="api-checkpoint-fork"),
    path("threads/<uuid:thread_id>/cancel/", api.ThreadCancelView.as_view(), name="api-thread-cancel"),
    path("threads/<uuid:thread_id>/resume/", api.ThreadResumeView.as_view(), name="api-thread-resume"),
    path("exports/fine-tuning/", trajectories_api.FineTuningExportView.as_view(), name="api-export-fine-tuning"),
    path("exports/preferences/", trajectories_api.PreferenceExportView.as_view(), name="api-export-preferences"),
]
