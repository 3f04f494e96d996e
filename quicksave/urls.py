from django.contrib import admin
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from quicksave.health import healthz

urlpatterns = [
    path("healthz", healthz, name="healthz"),
    path("api/v1/", include("checkpoints.urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="api-schema"), name="api-docs"),
    path("admin/", admin.site.urls),
]


def _api_error(request: HttpRequest, status: int, code: str, message: str) -> HttpResponse | None:
    if request.path.startswith("/api/"):
        return JsonResponse({"error": {"code": code, "message": message, "detail": {}}}, status=status)
    return None


def handler404(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    from django.views.defaults import page_not_found

    return _api_error(request, 404, "not_found", f"Nothing is at {request.path}.") or page_not_found(
        request, exception or Exception()
    )


def handler500(request: HttpRequest) -> HttpResponse:
    from django.views.defaults import server_error

    return _api_error(request, 500, "server_error", "Quicksave failed to handle this request.") or server_error(request)
