"""The readers the settings (gateway_project/settings/) read the environment with: each names the variable and
what it expects when a value is wrong, and each records the name it read (gateway_project/checks.py warns of a
GATEWAY_* variable set but never read). Not django-environ: its casts raise Python's bare "invalid literal for
int()", read an unknown word as a false boolean and "5m" as 5.0, so it would need these wrappers all the same."""

import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from django.core.exceptions import ImproperlyConfigured


def _bad(name: str, expected: str, value: str) -> ImproperlyConfigured:
    return ImproperlyConfigured(f"{name} must be {expected}, not {value!r}")


# Every variable the helpers read: one set in the environment but never read (misspelled, or no longer a setting)
# is named at start-up, with the closest of these (gateway_project/checks.py).
ENV_VARIABLES_READ: set[str] = set()


def env_str(name: str, default: str = "") -> str:
    """A value from NAME, or from the file named by NAME_FILE (for secrets mounted as files)."""
    ENV_VARIABLES_READ.update((name, f"{name}_FILE"))
    path = os.environ.get(f"{name}_FILE")
    if path:
        try:
            return Path(path).read_text().strip()
        except OSError as exc:
            raise _bad(f"{name}_FILE", f"a readable file ({exc.strerror})", path) from None
    return os.environ.get(name, default)


def env_bool(name: str, default: bool = False) -> bool:
    ENV_VARIABLES_READ.add(name)
    value = os.environ.get(name)
    if value is None:
        return default
    if value.strip().lower() in ("1", "true", "yes", "on"):
        return True
    if value.strip().lower() in ("", "0", "false", "no", "off"):
        return False
    raise _bad(name, "1, true, yes or on, or 0, false, no or off", value)


def _finite(value: str) -> float:
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(value)
    return number


def _number(name: str, default: Any, parse: Callable[[str], Any], expected: str, minimum: Any, maximum: Any) -> Any:
    """NAME parsed by `parse` (ValueError: not `expected`) and within its bounds, or `default` when unset."""
    ENV_VARIABLES_READ.add(name)
    value = os.environ.get(name, "").strip()
    if not value:
        return default
    try:
        number = parse(value)
    except ValueError:
        raise _bad(name, expected, value) from None
    if (minimum is not None and number < minimum) or (maximum is not None and number > maximum):
        raise _bad(name, f"between {minimum} and {maximum}" if maximum is not None else f"at least {minimum}", value)
    return number


def env_int(name: str, default: int, *, minimum: int | None = None, maximum: int | None = None) -> int:
    return _number(name, default, int, "an integer", minimum, maximum)


def env_float(name: str, default: float, *, minimum: float | None = None, maximum: float | None = None) -> float:
    return _number(name, default, _finite, "a number", minimum, maximum)


def env_choice(name: str, default: str, choices: tuple[str, ...]) -> str:
    value = env_str(name, default)
    if value not in choices:
        quoted = [repr(choice) for choice in choices]
        raise _bad(name, f"{', '.join(quoted[:-1])} or {quoted[-1]}", value)
    return value


def env_list(name: str, default: str) -> list[str]:
    return [item.strip() for item in env_str(name, default).split(",") if item.strip()]


def env_secret(name: str) -> str:
    """A key from NAME, or from the file NAME_FILE names; an empty file stops the process, naming it, so that no
    key is ever made in place of one that was meant to be given."""
    value = env_str(name)
    path = os.environ.get(f"{name}_FILE")
    if path and not value:
        raise ImproperlyConfigured(f"{name}_FILE names an empty file, not a key: {path!r}")
    return value
