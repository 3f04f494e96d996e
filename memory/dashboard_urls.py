from django.urls import path

from memory import views

app_name = "memory"

urlpatterns = [
    path("", views.browse, name="browse"),
    path("item/", views.item, name="item"),
    path("item/rollback/", views.rollback, name="rollback"),
]
