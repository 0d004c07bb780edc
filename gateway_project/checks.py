"""Start-up checks of the environment that the settings cannot make while it reads it: a GATEWAY_* variable that is
set but that no setting reads is misspelled or no longer a setting, and would otherwise be ignored in silence; stdio
servers run unconfined (GATEWAY_STDIO_SANDBOX=off); code mode is not installed. `manage.py check` (and migrate) report
them; the web process and Celery log them as they start (they run no checks)."""

import difflib
import logging
import os
from collections.abc import Collection, Mapping
from typing import Any

from django.conf import settings
from django.core import checks

from gateway_project.environment import ENV_VARIABLES_READ
from gateway_project.lib.code_mode import code_mode_missing, not_installed_message

logger = logging.getLogger(__name__)
TAG = "switchboard"
UNKNOWN_VARIABLE = "switchboard.W001"
UNCONFINED = "switchboard.W002"
CODE_MODE_ABSENT = "switchboard.I001"
PREFIX = "GATEWAY_"


def env_unknown_warnings(*, environ: Mapping[str, str], known: Collection[str]) -> list[checks.Warning]:
    """One warning per GATEWAY_* variable of `environ` not in `known`, naming the closest known one. Only
    names: a value may be a secret."""
    # Compared without the prefix they all share, which would make any two names look alike.
    candidates = sorted(name.removeprefix(PREFIX) for name in known if name.startswith(PREFIX))
    warnings = []
    for name in sorted(n for n in environ if n.startswith(PREFIX) and n not in known):
        closest = difflib.get_close_matches(name.removeprefix(PREFIX), candidates, n=1)
        guess = f": did you mean {PREFIX}{closest[0]}?" if closest else "."
        warnings.append(
            checks.Warning(
                f"{name} is set but is not a setting Switchboard reads, so it is ignored{guess}",
                hint="docs/settings.md lists every setting.",
                id=UNKNOWN_VARIABLE,
            )
        )
    return warnings


@checks.register(TAG)
def env_unknown_check(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    return env_unknown_warnings(environ=os.environ, known=ENV_VARIABLES_READ)


@checks.register(TAG)
def sandbox_check(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    if settings.GATEWAY_STDIO_SANDBOX != "off":
        return []
    message = (
        "GATEWAY_STDIO_SANDBOX=off: stdio servers run unconfined, as the gateway's own user, and can read its keys, "
        "its environment and its database"
    )
    return [checks.Warning(message, hint="docs/security.md, 'Stdio servers'.", id=UNCONFINED)]


@checks.register(TAG)
def code_mode_check(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Not a fault (the image's default target leaves code mode out on purpose), but said where tools go missing."""
    if not (missing := code_mode_missing()):
        return []
    message = f"{not_installed_message(missing)}: search_tools and execute are not offered (GATEWAY_CODE_MODE=off)"
    hint = "docs/deploy.md, 'The image': its `full` target has code mode."
    return [checks.Info(message, hint=hint, id=CODE_MODE_ABSENT)]


def start_warnings_log() -> None:
    """Log what the checks above find, for servers that do not run Django's checks (Daphne, uvicorn, Celery)."""
    for message in checks.run_checks(tags=[TAG]):
        if not message.is_silenced():
            level = logging.INFO if message.level < checks.WARNING else logging.WARNING
            logger.log(level, "%s (%s; %s)", message.msg, message.id, message.hint)
