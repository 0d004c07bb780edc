"""The web process's entry point leaves what it loaded out of the garbage collector's sight (gc.freeze), so that a
full collection under load scans only what requests made: 150-220 ms a pause before, about 10 ms after
(docs/reliability.md, load shedding)."""

import subprocess
import sys


def test_loading_the_application_freezes_what_it_loaded(server_env):
    probe = "import gc, gateway_project.asgi; print(gc.get_freeze_count())"
    loaded = subprocess.run(
        [sys.executable, "-c", probe], env=server_env, capture_output=True, text=True, timeout=120, check=True
    )
    # Django, the apps and the SDK: some 200,000 objects on Python 3.11, none frozen without it.
    assert int(loaded.stdout.split()[-1]) > 100_000, loaded.stdout
