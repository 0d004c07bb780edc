"""Passwords for the demo's console logins, made at random and stored by a hasher fit for them.

Key stretching (PBKDF2 at Django's iterations: 0.5 s of CPU a hash on the benchmark's machine) protects passwords a
person chose, which can be guessed; a password made here is 96 random bits, which no number of iterations makes
easier or harder to find. They are stored by GeneratedPasswordHasher, a few iterations, and Django rehashes one with
its default hasher at its first sign-in (it upgrades any hash that is not of the preferred hasher). A first install
made three full hashes before it could print its key (docs/benchmarks.md, "Cold start of the embedded default")."""

import secrets
from collections.abc import Iterable
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.hashers import PBKDF2PasswordHasher, make_password
from django.contrib.auth.models import AbstractBaseUser


class GeneratedPasswordHasher(PBKDF2PasswordHasher):
    """PBKDF2-SHA256 at few iterations, for random passwords only (listed after the default in PASSWORD_HASHERS)."""

    algorithm = "pbkdf2_sha256_generated"
    iterations = 1_000


class Passwords:
    """A new random password for each login to make."""

    def __init__(self, logins: Iterable[str]) -> None:
        self._made = {login: secrets.token_urlsafe(12) for login in logins}

    def __contains__(self, login: str) -> bool:
        return login in self._made

    def user_create(self, login: str, **fields: Any) -> tuple[AbstractBaseUser, str]:
        """The user `login` made with its password's hash, and the password to show once."""
        password = self._made[login]
        hashed = make_password(password, hasher=GeneratedPasswordHasher.algorithm)
        return get_user_model().objects.create(username=login, password=hashed, **fields), password
