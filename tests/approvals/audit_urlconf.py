"""The project's URLs plus the audit page, for tests that run before quicksave/urls.py includes it."""

from django.urls import include, path

from quicksave.urls import handler400, handler403, handler404, handler500
from quicksave.urls import urlpatterns as project_urlpatterns

__all__ = ["handler400", "handler403", "handler404", "handler500", "urlpatterns"]

urlpatterns = [
    *[pattern for pattern in project_urlpatterns if getattr(pattern, "namespace", None) != "audit"],
    path("audit/", include("approvals.audit_urls")),
]
