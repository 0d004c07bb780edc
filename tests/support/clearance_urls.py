"""A one-view Django project for the tests of ClearanceMiddleware: the view shows what the guard vouched for."""

from dataclasses import asdict

from django.http import JsonResponse
from django.urls import path


async def whoami(request):
    return JsonResponse(asdict(request.clearance))


urlpatterns = [path("whoami", whoami)]
