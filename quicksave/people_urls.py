"""The people pages (admins only)."""

from django.urls import path

from quicksave import people_views

app_name = "people"

urlpatterns = [
    path("", people_views.person_list, name="list"),
    path("new/", people_views.person_new, name="new"),
    path("<int:user_id>/", people_views.person_detail, name="detail"),
    path("<int:user_id>/role/", people_views.person_role, name="role"),
    path("<int:user_id>/deactivate/", people_views.person_deactivate, name="deactivate"),
    path("<int:user_id>/reactivate/", people_views.person_reactivate, name="reactivate"),
    path("<int:user_id>/reset-password/", people_views.person_reset_password, name="reset-password"),
]
