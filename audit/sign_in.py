"""Password sign-in locks, kept by django-axes (settings: AXES_*), which hooks authenticate() and so every sign-in
page: after GATEWAY_SIGN_IN_MAX_FAILURES failures for one username from one address, that pair is refused, right
password or not, until GATEWAY_SIGN_IN_WINDOW_SECONDS have passed or an operator runs axes_reset_username.
Here: the audit row of a lock, what a locked person is told, and which attempts axes leaves alone."""

import logging
import math

from axes.helpers import get_client_username, get_cool_off, get_failure_limit
from axes.signals import user_locked_out
from django.contrib.auth import get_user_model
from django.dispatch import receiver
from django.http import HttpRequest, HttpResponse
from django.template.loader import render_to_string

from audit.services import audit_record

logger = logging.getLogger(__name__)


def sign_in_lock_record(*, username: str, address: str, failures: int, page: str) -> None:
    """One audit row and one log line per lock (not per failure, which would let a flood of guesses write rows
    without bound). The username only if it is one: people type passwords into that field too."""
    known = get_user_model().objects.filter(username=username).exists()
    named = username if known else "an unknown username"
    logger.warning("sign-in locked for %s from %s after %d failures at %s", named, address, failures, page)
    detail = {"action": "sign_in_locked", "address": address, "failures": failures, "known_user": known, "page": page}
    audit_record(kind="sign_in", actor=username if known else "", detail=detail)


@receiver(user_locked_out)
def _locked_out(sender: str, request: HttpRequest, username: str | None, ip_address: str, **kwargs) -> None:
    # axes says so again at each refused attempt while locked; only the failure it counted carries a count.
    failures = request.axes_failures_since_start
    if failures is not None:
        sign_in_lock_record(username=username or "", address=ip_address, failures=failures, page=request.path)


def sign_in_locked_response(request: HttpRequest, *_: object) -> HttpResponse:
    """AXES_LOCKOUT_CALLABLE: what a locked pair is told, on any sign-in page. axes passes the original response
    and the credentials after the request, in an order that differs between sync and async middleware: unused."""
    wait = math.ceil(get_cool_off(request).total_seconds() / 60)
    context = {
        "failures": get_failure_limit(request, None),
        "wait": f"{wait} minute{'s' if wait != 1 else ''}",
        "username": get_client_username(request, None) or "USERNAME",
    }
    response = HttpResponse(render_to_string("registration/locked.html", context, request), status=429)
    response["Retry-After"] = str(int(get_cool_off(request).total_seconds()))
    return response


def sign_in_not_a_password(request: HttpRequest, credentials: dict | None) -> bool:
    """AXES_WHITELIST_CALLABLE: an authentication with no username is the IdP's callback, which its IdP throttles.
    Counting those would lock a whole address (everyone behind one proxy) out of signing in with the IdP."""
    return not get_client_username(request, credentials)
