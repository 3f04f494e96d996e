"""The dashboard's pages (the API lives in checkpoints/urls.py)."""

from django.urls import path

from checkpoints.views import checkpoint, diff, threads

app_name = "dashboard"

urlpatterns = [
    path("", threads.thread_list, name="threads"),
    path("threads/<uuid:thread_id>/", threads.thread_detail, name="thread"),
    path("checkpoints/<uuid:checkpoint_id>/", checkpoint.checkpoint_detail, name="checkpoint"),
    path("checkpoints/<uuid:checkpoint_id>/diff/", diff.diff_page, name="diff"),
]
