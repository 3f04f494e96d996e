"""The dashboard's pages (the API lives in checkpoints/urls.py)."""

from django.urls import path

from checkpoints.views import actions, checkpoint, diff, exports, history, threads

app_name = "dashboard"

urlpatterns = [
    path("", threads.thread_list, name="threads"),
    path("training-data/", exports.training_export, name="training-export"),
    path("threads/<uuid:thread_id>/", threads.thread_detail, name="thread"),
    path("threads/<uuid:thread_id>/history/", history.value_history, name="value-history"),
    path("checkpoints/<uuid:checkpoint_id>/", checkpoint.checkpoint_detail, name="checkpoint"),
    path("checkpoints/<uuid:checkpoint_id>/diff/", diff.diff_page, name="diff"),
    path("checkpoints/<uuid:checkpoint_id>/fork/", actions.fork_checkpoint, name="fork"),
    path("checkpoints/<uuid:checkpoint_id>/rerun/", actions.rerun_checkpoint, name="rerun"),
    path("threads/<uuid:thread_id>/cancel/", actions.cancel_thread, name="cancel"),
    path("threads/<uuid:thread_id>/resume/", actions.resume_thread, name="resume"),
    path("threads/<uuid:thread_id>/delete/", actions.delete_thread, name="delete"),
    path("threads/<uuid:thread_id>/blobs/<str:sha256>/", checkpoint.blob_download, name="blob"),
]
