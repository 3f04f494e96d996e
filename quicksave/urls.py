from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, HttpResponsePermanentRedirect, JsonResponse
from django.shortcuts import render
from django.templatetags.static import static
from django.urls import Resolver404, include, path
from django.views.generic import RedirectView
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView

from quicksave.health import healthz
from quicksave.people_views import set_password
from quicksave.scrape import metrics_view
from quicksave.signin import ThrottledLoginView


def favicon(request: HttpRequest) -> HttpResponse:
    # Resolved per request: with hashed static names the manifest may not exist at import time.
    return HttpResponsePermanentRedirect(static("favicon.svg"))


urlpatterns = [
    path("healthz", healthz, name="healthz"),
    path("metrics", metrics_view, name="metrics"),
    # Pages that do not link an icon (the Django admin's) get the browser's default request answered.
    path("favicon.ico", favicon),
    path("api/v1/", include("checkpoints.urls")),
    path("api/v1/", include("approvals.urls")),
    path("api/v1/", include("quicksave_agents.urls")),
    path("api/v1/notifications/", include("notifications.urls")),
    path("api/v1/memory/", include("memory.urls")),
    # For people and agents who are signed in (SPECTACULAR_SETTINGS["SERVE_PERMISSIONS"]); the docs
    # send a signed-out browser to the sign-in page. The split view serves its script from a URL,
    # not inline, as the Content-Security-Policy requires.
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("api/docs/", login_required(SpectacularSwaggerSplitView.as_view(url_name="api-schema")), name="api-docs"),
    path("login/", ThrottledLoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("password/", set_password, name="set-password"),
    # One sign-in page, the throttled one: the Django admin's own would bypass the throttle.
    path("admin/login/", RedirectView.as_view(pattern_name="login", query_string=True)),
    path("admin/", admin.site.urls),
    path("inbox/", include("approvals.dashboard_urls")),
    path("policies/", include("approvals.policy_urls")),
    path("audit/", include("audit.urls")),
    path("people/", include("quicksave.people_urls")),
    path("agents/", include("quicksave_agents.dashboard_urls")),
    path("notifications/", include("notifications.dashboard_urls")),
    path("memory/", include("memory.dashboard_urls")),
    path("", include("checkpoints.dashboard_urls")),
]


def _error(request: HttpRequest, status: int, code: str, default: str, exception: Exception | None) -> HttpResponse:
    """API paths get the JSON error format; pages get a page in the dashboard's layout."""
    message = default
    args = getattr(exception, "args", ())
    if args and isinstance(args[0], str) and not isinstance(exception, Resolver404):
        message = args[0]
    if request.path.startswith("/api/"):
        return JsonResponse({"error": {"code": code, "message": message, "detail": {}}}, status=status)
    return render(request, f"{status}.html", {"message": message if message != default else ""}, status=status)


def handler400(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    return _error(request, 400, "bad_request", "The request could not be understood.", exception)


def handler403(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    return _error(request, 403, "permission_denied", "You may not do this.", exception)


def handler404(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    return _error(request, 404, "not_found", f"Nothing is at {request.path}.", exception)


def handler500(request: HttpRequest) -> HttpResponse:
    if request.path.startswith("/api/"):
        message = "Quicksave failed to handle this request."
        return JsonResponse({"error": {"code": "server_error", "message": message, "detail": {}}}, status=500)
    return render(request, "500.html", status=500)
