"""Console sign-in, throttled: failed attempts are counted per username and client address, and a pair
that reached GATEWAY_SIGN_IN_MAX_FAILURES is refused, right password or not, until its window ends. The
count lives in the `sign_in` cache (Redis when there is one), so every web process sees it. Counting the
pair rather than the address alone keeps other operators behind the same proxy able to sign in."""

import hashlib
import logging
import math

from django import forms
from django.conf import settings
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth import get_user_model
from django.core.cache import caches
from django.http import HttpRequest

from audit.services import audit_record

logger = logging.getLogger(__name__)


class SignInAttempts:
    def __init__(self, request: HttpRequest | None, username: str) -> None:
        address = request.META.get("REMOTE_ADDR", "") if request is not None else ""
        # Hashed: usernames typed by strangers are no business of the cache, and any text makes a safe key.
        self.key = "failures:" + hashlib.sha256(f"{address}\0{username.casefold()}".encode()).hexdigest()
        self.address, self.username = address, username
        self.cache = caches["sign_in"]

    def locked(self) -> bool:
        return (self.cache.get(self.key) or 0) >= settings.GATEWAY_SIGN_IN_MAX_FAILURES

    def failed(self) -> None:
        window = settings.GATEWAY_SIGN_IN_WINDOW_SECONDS
        self.cache.add(self.key, 0, window)  # the window starts at the first failure
        try:
            failures = self.cache.incr(self.key)
        except ValueError:  # the window ended between the two calls
            self.cache.add(self.key, 1, window)
            failures = 1
        if failures == settings.GATEWAY_SIGN_IN_MAX_FAILURES:
            self._locked_record(failures)

    def _locked_record(self, failures: int) -> None:
        """One audit row and one log line per lock (not per failure, which would let a flood of guesses write
        rows without bound). The username only if it is one: people type passwords into that field too."""
        known = get_user_model().objects.filter(username=self.username).exists()
        named = self.username if known else "an unknown username"
        logger.warning("console sign-in locked for %s from %s after %d failures", named, self.address, failures)
        detail = {"action": "sign_in_locked", "address": self.address, "failures": failures, "known_user": known}
        audit_record(kind="sign_in", actor=self.username if known else "", detail=detail)

    def clear(self) -> None:
        self.cache.delete(self.key)


class ThrottledAuthenticationForm(AdminAuthenticationForm):
    def clean(self) -> dict:
        attempts = SignInAttempts(self.request, self.data.get("username") or "")
        if attempts.locked():
            minutes = math.ceil(settings.GATEWAY_SIGN_IN_WINDOW_SECONDS / 60)
            wait = f"{minutes} minute{'s' if minutes != 1 else ''}"
            raise forms.ValidationError(
                f"Too many failed sign-ins for this account from your address. Try again in {wait}, "
                "or ask another administrator to reset your password.",
                code="locked",
            )
        try:
            cleaned = super().clean()
        except forms.ValidationError:
            attempts.failed()
            raise
        attempts.clear()
        return cleaned
