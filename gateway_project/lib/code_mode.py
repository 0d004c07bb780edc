"""Whether code mode can run here: its sandbox is Deno (the PyPI package `deno` ships the binary) and its tool
search ranks with NumPy. The image's default target leaves both out (docs/deploy.md, "The image"); the settings
turn code mode off where they are missing, and refuse a process told to turn it on."""

import importlib.util

PARTS = ("deno", "numpy")
NOT_INSTALLED = "CODE_MODE_NOT_INSTALLED"


def code_mode_missing() -> list[str]:
    """The packages code mode needs that are not installed: none where it can run."""
    return [name for name in PARTS if importlib.util.find_spec(name) is None]


def not_installed_message(missing: list[str]) -> str:
    return f"code mode is not installed here ({' and '.join(missing)} missing)"
