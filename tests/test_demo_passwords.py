"""The demo's console passwords, made at random, are stored by a hasher of few iterations (no stretching helps a
96-bit random secret) and rehashed with Django's default at their first sign-in."""

import uuid

from django.contrib.auth import authenticate
from django.contrib.auth.hashers import identify_hasher
from django.test import RequestFactory

from handoff.management.demo_passwords import GeneratedPasswordHasher, Passwords


def _signed_in(login: str, password: str) -> object:
    return authenticate(RequestFactory().post("/admin/login/"), username=login, password=password)


def test_a_made_password_opens_its_account_and_is_rehashed_by_the_default_hasher_at_its_first_sign_in(db):
    login = f"made-{uuid.uuid4().hex[:8]}"
    passwords = Passwords([login])
    user, password = passwords.user_create(login, is_staff=True)
    try:
        assert login in passwords and "other" not in passwords
        assert len(password) == 16  # 12 random bytes, URL-safe base64
        assert user.password.startswith(f"pbkdf2_sha256_generated${GeneratedPasswordHasher.iterations}$")
        assert _signed_in(login, password + "x") is None
        user.refresh_from_db()
        assert identify_hasher(user.password).algorithm == "pbkdf2_sha256_generated"  # a wrong one changes nothing
        assert _signed_in(login, password) == user
        user.refresh_from_db()
        assert identify_hasher(user.password).algorithm == "pbkdf2_sha256"  # the default, at Django's iterations
        assert _signed_in(login, password) == user
    finally:
        user.delete()


def test_the_generated_hasher_is_never_the_default(settings):
    assert settings.PASSWORD_HASHERS[0] == "django.contrib.auth.hashers.PBKDF2PasswordHasher"
    assert settings.PASSWORD_HASHERS[-1] == "handoff.management.demo_passwords.GeneratedPasswordHasher"
