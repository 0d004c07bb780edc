"""The image's full target (`scripts/image -- --target full`): code mode's Deno, NumPy and model. The same stack as
tests/deploy/test_image.py (its fixtures, this module's image): an agent's code runs on a worker of the image.
Opt-in like it (SWITCHBOARD_IMAGE_TESTS=1)."""

import json
import subprocess

import pytest

from tests.clients import call, tool_names
from tests.deploy import test_image
from tests.deploy.test_image import IMAGE_TESTS, ROOT, podman_run
from tests.helpers import run, until

FULL = "localhost/switchboard:full"
pytestmark = IMAGE_TESTS
# That module's fixtures, run here with this module's image.
database_url, keys, started, web = test_image.database_url, test_image.keys, test_image.started, test_image.web


@pytest.fixture(scope="module")
def image() -> str:
    build = [ROOT / "scripts" / "image", FULL, "--", "--target", "full"]
    subprocess.run(build, cwd=ROOT, check=True, timeout=1800, stdout=subprocess.DEVNULL)
    return FULL


def test_an_agents_code_runs_on_a_worker_of_the_full_image(image, keys, web, started):
    podman_run(image, keys, "migrate")
    started("worker", "GATEWAY_CREDENTIAL_KEYS_FILE=/run/secrets/switchboard/credential_key")
    key = podman_run(image, keys, "python", "manage.py", "create_agent", "code-tester").strip()

    async def scenario():
        await until(lambda: _offers(web, key), timeout=10)
        found = await call(web, key, "switchboard__search_tools", {"query": "run code"})
        return found, await call(web, key, "switchboard__execute", {"code": "return [6 * 7, typeof Deno];"})

    found, executed = run(scenario)
    assert not found.is_error and found.structured_content["ranking"] in ("lexical", "lexical+semantic")
    assert not executed.is_error, executed.content
    assert json.loads(executed.content[0].text) == [42, "object"]


async def _offers(web: str, key: str) -> bool:
    return {"switchboard__search_tools", "switchboard__execute"} <= set(await tool_names(web, key))
