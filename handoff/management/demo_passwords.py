"""Passwords for the demo's console logins made now, hashed beside the rest of its setup.

A hash is PBKDF2 at Django's iterations: 0.5 s of CPU each on the benchmark's machine, three on a first install,
before the key can be printed. hashlib releases the GIL while it hashes, so threads hash them from setup_demo's start
while its own thread goes on with the rest (docs/benchmarks.md, "Cold start of the embedded default")."""

import secrets
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.hashers import make_password
from django.contrib.auth.models import AbstractBaseUser


class Passwords:
    """A new password for each login to make, hashing from now."""

    def __init__(self, logins: Iterable[str]) -> None:
        self._made: dict[str, tuple[str, Future[str]]] = {}
        threads = ThreadPoolExecutor(thread_name_prefix="password-hash")
        for login in logins:
            password = secrets.token_urlsafe(12)
            self._made[login] = (password, threads.submit(make_password, password))
        threads.shutdown(wait=False)  # its threads end with their hashes

    def __contains__(self, login: str) -> bool:
        return login in self._made

    def user_create(self, login: str, **fields: Any) -> tuple[AbstractBaseUser, str]:
        """The user `login` made with its password's hash (waited for), and the password to show once."""
        password, hashed = self._made[login]
        return get_user_model().objects.create(username=login, password=hashed.result(), **fields), password
