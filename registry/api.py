"""The service registry's HTTP API, for automation: list upstreams and switch upstreams and server groups on
and off, effective at once (like the admin's actions, through the same audited services).

Authenticated with HTTP Basic as a Django user who holds the model's change permission; JSON in and out.
No session cookie is read; writes demand a JSON content type, which a cross-site form cannot send.
"""

import base64
import binascii
import json
from collections.abc import Callable
from typing import Any

from django.contrib.auth import authenticate
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

from policy.limits import limit_store
from policy.models import ServerGroup
from policy.services import group_set_enabled
from registry.models import Upstream
from registry.services import upstream_set_enabled


def _error(status: int, message: str, **headers: str) -> JsonResponse:
    return JsonResponse({"error": message}, status=status, headers=headers)


def _operator(request: HttpRequest, permission: str) -> Any:
    """The authenticated user, or the response that refuses the request."""
    scheme, _, encoded = request.headers.get("Authorization", "").partition(" ")
    try:
        username, _, password = base64.b64decode(encoded, validate=True).decode().partition(":")
    except (binascii.Error, UnicodeDecodeError):
        username = password = ""
    user = authenticate(request, username=username, password=password) if scheme.lower() == "basic" else None
    if user is None:
        return _error(
            401,
            "Authenticate with HTTP Basic as a gateway operator.",
            **{"WWW-Authenticate": 'Basic realm="switchboard"'},
        )
    if not user.has_perm(permission):
        return _error(403, f"This user lacks the permission {permission}.")
    return user


def _enabled_from(request: HttpRequest) -> bool | JsonResponse:
    # A browser that once answered the Basic challenge sends the credentials again by itself; a cross-site form
    # can only send form or text types. Demanding JSON makes such a request a preflighted one, which fails.
    if request.content_type != "application/json":
        return _error(415, "Send Content-Type: application/json.")
    try:
        body = json.loads(request.body or b"null")
    except json.JSONDecodeError:
        body = None
    if not isinstance(body, dict) or not isinstance(body.get("enabled"), bool):
        return _error(400, 'Send a JSON object such as {"enabled": false}.')
    return body["enabled"]


def _switch(request: HttpRequest, permission: str, find: Callable[[], Any], apply: Callable[..., None]) -> JsonResponse:
    user = _operator(request, permission)
    if isinstance(user, JsonResponse):
        return user
    enabled = _enabled_from(request)
    if isinstance(enabled, JsonResponse):
        return enabled
    target = find()
    if target is None:
        return _error(404, "No such upstream or group.")
    apply(target, enabled, user.get_username())
    return JsonResponse({"enabled": enabled})


@csrf_exempt
@require_POST
def upstream_enabled(request: HttpRequest, slug: str) -> JsonResponse:
    return _switch(
        request,
        "registry.change_upstream",
        lambda: Upstream.objects.filter(slug=slug).first(),
        lambda upstream, enabled, actor: upstream_set_enabled(upstream=upstream, enabled=enabled, actor=actor),
    )


@csrf_exempt
@require_POST
def group_enabled(request: HttpRequest, name: str) -> JsonResponse:
    return _switch(
        request,
        "policy.change_servergroup",
        lambda: ServerGroup.objects.filter(name=name).first(),
        lambda group, enabled, actor: group_set_enabled(group=group, enabled=enabled, actor=actor),
    )


def _circuit(upstream: Upstream) -> dict[str, Any]:
    status = limit_store().breaker(upstream.id)
    return {"state": status.state, "failures": status.failures, "retry_after": round(status.retry_after, 3)}


@require_GET
def upstream_list(request: HttpRequest) -> JsonResponse:
    user = _operator(request, "registry.view_upstream")
    if isinstance(user, JsonResponse):
        return user
    upstreams = Upstream.objects.select_related("group")
    return JsonResponse(
        {
            "upstreams": [
                {
                    "slug": u.slug,
                    "transport": u.transport,
                    "group": u.group.name if u.group else None,
                    "enabled": u.enabled,
                    "reachable": u.is_reachable,
                    "circuit": _circuit(u),
                }
                for u in upstreams
            ]
        }
    )
