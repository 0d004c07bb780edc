"""The built-in authorization server's pages beyond django-oauth-toolkit's own: client registration with a
bounded rate per address, the consent page (which no other site may frame), and sign-in with a console
account."""

import json
import time
import uuid
from collections import deque

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from oauth2_provider.models import get_application_model
from oauth2_provider.views import AuthorizationView
from oauth2_provider.views.dynamic_client_registration import DynamicClientRegistrationView

from gateway_project.lib.redis_clients import sync_redis

HOUR = 3600.0
_registrations: dict[str, deque[float]] = {}  # without Redis: per address, when it registered in the last hour
ADDRESSES = 10_000


def _flooding(address: str) -> float:
    """Seconds until `address` may register again, or 0 (and this registration is counted): a sliding hour,
    shared by every web process through Redis when there is one."""
    now = time.time()
    if settings.REDIS_URL:
        key = f"{settings.GATEWAY_REDIS_PREFIX}registrations:{address}"
        pipe = sync_redis().pipeline()  # MULTI: the trim, the count and the add are one step
        pipe.zremrangebyscore(key, 0, now - HOUR)
        pipe.zrange(key, 0, 0, withscores=True)
        pipe.zcard(key)
        _trimmed, oldest, count = pipe.execute()
        if count >= settings.GATEWAY_AUTH_REGISTRATIONS_PER_HOUR:
            return oldest[0][1] + HOUR - now
        sync_redis().pipeline().zadd(key, {f"{now}:{uuid.uuid4().hex}": now}).expire(key, int(HOUR)).execute()
        return 0.0
    window = _registrations.setdefault(address, deque())
    while window and window[0] <= now - HOUR:
        window.popleft()
    if len(window) >= settings.GATEWAY_AUTH_REGISTRATIONS_PER_HOUR:
        return window[0] + HOUR - now
    window.append(now)
    if len(_registrations) > ADDRESSES:
        _registrations.pop(next(iter(_registrations)))
    return 0.0


class RegistrationView(DynamicClientRegistrationView):
    """RFC 7591 registration, open as MCP clients expect it, at most GATEWAY_AUTH_REGISTRATIONS_PER_HOUR per
    address."""

    def post(self, request: HttpRequest, *args, **kwargs) -> HttpResponse:
        if wait := _flooding(request.META.get("REMOTE_ADDR", "")):
            limit = settings.GATEWAY_AUTH_REGISTRATIONS_PER_HOUR
            description = f"This address registered {limit} clients in the last hour; retry in {int(wait) + 1} s"
            response = JsonResponse({"error": "too_many_requests", "error_description": description}, status=429)
            response["Retry-After"] = str(int(wait) + 1)
            return response
        response = super().post(request, *args, **kwargs)
        if response.status_code == 201:  # its ID tokens are signed with the server's RSA key
            client_id = json.loads(response.content)["client_id"]
            Application = get_application_model()
            Application.objects.filter(client_id=client_id).update(algorithm=Application.RS256_ALGORITHM)
        return response


class ConsentView(AuthorizationView):
    """The consent page names the client, where it sends the person back, and what it asks for; no other
    site may frame it (clickjacking a consent is a classic)."""

    template_name = "oauth2_provider/authorize.html"

    def dispatch(self, request: HttpRequest, *args, **kwargs) -> HttpResponse:
        response = super().dispatch(request, *args, **kwargs)
        response["Content-Security-Policy"] = "frame-ancestors 'none'"
        return response
