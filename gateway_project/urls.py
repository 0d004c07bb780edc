from django.contrib import admin
from django.urls import path
from django.views.generic import RedirectView

urlpatterns = [
    path("", RedirectView.as_view(url="/admin/")),  # the console is the only page a person opens
    path("admin/", admin.site.urls),
]
