from django.urls import path

from notifications import api

urlpatterns = [
    path("endpoints/", api.EndpointListView.as_view(), name="api-notification-endpoints"),
    path("endpoints/<uuid:endpoint_id>/", api.EndpointDetailView.as_view(), name="api-notification-endpoint"),
    path(
        "endpoints/<uuid:endpoint_id>/rotate-secret/",
        api.RotateSecretView.as_view(),
        name="api-notification-endpoint-rotate",
    ),
    path("deliveries/", api.DeliveryListView.as_view(), name="api-notification-deliveries"),
    path("deliveries/<int:delivery_id>/", api.DeliveryDetailView.as_view(), name="api-notification-delivery"),
    path(
        "deliveries/<int:delivery_id>/redeliver/",
        api.RedeliverView.as_view(),
        name="api-notification-delivery-redeliver",
    ),
]
