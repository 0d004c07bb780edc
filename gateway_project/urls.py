from django.contrib import admin
from django.urls import path
from django.views.generic import RedirectView

from handoff.views import claim_redeem
from registry import api

urlpatterns = [
    path("", RedirectView.as_view(url="/admin/")),  # the console is the only page a person opens
    path("admin/", admin.site.urls),
    path("api/v1/upstreams", api.upstream_list),
    path("api/v1/upstreams/<slug:slug>/enabled", api.upstream_enabled),
    path("api/v1/groups/<str:name>/enabled", api.group_enabled),
    path("handoff/redeem", claim_redeem),
]
