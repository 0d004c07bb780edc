"""The web process's entry point leaves what it loaded out of the garbage collector's sight (gc.freeze), so that a
full collection under load scans only what requests made: 150-220 ms a pause before, about 10 ms after
(docs/reliability.md, load shedding); and a LOG_LEVEL above INFO drops uvicorn's access lines."""

import subprocess
import sys


def test_loading_the_application_freezes_what_it_loaded(server_env):
    probe = "import gc, gateway_project.asgi; print(gc.get_freeze_count())"
    loaded = subprocess.run(
        [sys.executable, "-c", probe], env=server_env, capture_output=True, text=True, timeout=120, check=True
    )
    # Django, the apps and the SDK: some 200,000 objects on Python 3.11, none frozen without it.
    assert int(loaded.stdout.split()[-1]) > 100_000, loaded.stdout


def _access_level(server_env: dict[str, str], log_level: str, uvicorn_level: str) -> str:
    """uvicorn's access logger's level once the application is loaded, uvicorn having set it to `uvicorn_level`."""
    probe = (
        f"import logging; logging.getLogger('uvicorn.access').setLevel('{uvicorn_level}'); "
        "import gateway_project.asgi; print(logging.getLevelName(logging.getLogger('uvicorn.access').level))"
    )
    env = server_env | {"LOG_LEVEL": log_level}
    loaded = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120, check=True
    )
    return loaded.stdout.split()[-1]


def test_a_log_level_above_info_drops_uvicorns_access_lines(server_env):
    assert _access_level(server_env, "WARNING", "INFO") == "WARNING"
    assert _access_level(server_env, "INFO", "INFO") == "INFO"
    assert _access_level(server_env, "INFO", "ERROR") == "ERROR"  # uvicorn's own --log-level stands
