"""Routes of the memory API, under /api/v1/memory/. An item's key is the rest of its path (it may
hold `/`), so its history's route comes first."""

from django.urls import path, re_path

from memory import api

NAMESPACE = r"(?P<namespace>[^/]+)"

urlpatterns = [
    path("namespaces/", api.NamespaceListView.as_view(), name="api-memory-namespaces"),
    path("items/", api.SearchView.as_view(), name="api-memory-search"),
    re_path(rf"^namespaces/{NAMESPACE}/items/$", api.NamespaceItemsView.as_view(), name="api-memory-items"),
    re_path(
        rf"^namespaces/{NAMESPACE}/items/(?P<key>.+)/history/$", api.HistoryView.as_view(), name="api-memory-history"
    ),
    re_path(rf"^namespaces/{NAMESPACE}/items/(?P<key>.+)/$", api.ItemView.as_view(), name="api-memory-item"),
    path("boards/", api.BoardListView.as_view(), name="api-memory-boards"),
    re_path(rf"^boards/{NAMESPACE}/$", api.BoardView.as_view(), name="api-memory-board"),
    re_path(rf"^boards/{NAMESPACE}/events/$", api.BoardEventsView.as_view(), name="api-memory-board-events"),
    re_path(rf"^boards/{NAMESPACE}/leases/$", api.LeaseListView.as_view(), name="api-memory-leases"),
    re_path(rf"^boards/{NAMESPACE}/leases/renew/$", api.LeaseRenewView.as_view(), name="api-memory-lease-renew"),
    re_path(rf"^boards/{NAMESPACE}/leases/release/$", api.LeaseReleaseView.as_view(), name="api-memory-lease-release"),
    path("grants/", api.GrantListView.as_view(), name="api-memory-grants"),
    path("grants/<int:grant_id>/revoke/", api.GrantRevokeView.as_view(), name="api-memory-grant-revoke"),
]
