"""The notifications pages (admins), and decision links (reviewers)."""

from django.urls import path

from notifications import views

app_name = "notifications"

urlpatterns = [
    path("", views.endpoint_list, name="list"),
    path("new/", views.endpoint_create, name="create"),
    path("<uuid:endpoint_id>/", views.endpoint_detail, name="endpoint"),
    path("<uuid:endpoint_id>/subscriptions/", views.subscription_add, name="subscription-add"),
    path(
        "<uuid:endpoint_id>/subscriptions/<int:subscription_id>/remove/",
        views.subscription_remove,
        name="subscription-remove",
    ),
    path("<uuid:endpoint_id>/secret/", views.secret_rotate, name="secret-rotate"),
    path("<uuid:endpoint_id>/delete/", views.endpoint_delete, name="delete"),
    path("deliveries/<int:delivery_id>/", views.delivery_detail, name="delivery"),
    path("deliveries/<int:delivery_id>/send-again/", views.delivery_resend, name="delivery-resend"),
    path("decide/<str:token>/", views.decide, name="decide"),
]
