"""The version is written once, `gateway_project.__version__`: the gateway's serverInfo in both eras, `/readyz`,
the console's footer and the package's metadata read it there, and CHANGELOG.md's latest release is that
version."""

import re
import subprocess
import sys
from email.parser import Parser

import httpx2
import pytest
from django.test import Client
from packaging.requirements import Requirement

from gateway_project import __version__
from tests.clients import sdk_client
from tests.helpers import run
from tests.servers import ROOT

FOOTER = re.compile(r'<footer id="footer">\s*<p class="help">([^<]*)</p>\s*</footer>')
RELEASE = re.compile(r"^## \[(?!Unreleased\])([^\]]+)\] - \d{4}-\d{2}-\d{2}$", re.MULTILINE)


@pytest.mark.parametrize("mode", ["legacy", "auto"])
def test_the_gateway_names_the_one_version_in_its_server_info_and_its_readiness(inline_gateway, world, mode):
    async def scenario():
        async with sdk_client(inline_gateway.url, world.key, mode) as client:
            return client.server_info

    info = run(scenario)
    ready = httpx2.get(f"{inline_gateway.url}/readyz", timeout=5)
    assert (info.name, info.version) == ("switchboard", __version__)
    assert (ready.status_code, ready.json()["version"]) == (200, __version__)


def test_the_consoles_pages_and_its_sign_in_name_the_one_version_in_their_footer(admin_client):
    for page in (admin_client.get("/admin/"), Client().get("/admin/login/")):
        assert page.status_code == 200
        assert FOOTER.search(page.content.decode()).group(1) == f"Switchboard {__version__}"


def test_the_changelogs_latest_release_is_the_one_version():
    assert RELEASE.search((ROOT / "CHANGELOG.md").read_text()).group(1) == __version__


def test_the_packages_metadata_names_the_one_version(tmp_path):
    # setuptools' own build hook, in a process of its own (it changes the working directory and argv).
    built = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from setuptools import build_meta as b; "
            "print(b.prepare_metadata_for_build_wheel(sys.argv[1]))",
            str(tmp_path),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    metadata = Parser().parsestr((tmp_path / built.stdout.split()[-1] / "METADATA").read_text())
    assert (metadata["Name"], metadata["Version"], metadata["License"]) == (
        "switchboard-gateway",
        __version__,
        "Apache-2.0",
    )
    required = [line for line in (ROOT / "requirements.txt").read_text().splitlines() if not line.startswith("#")]
    assert {str(Requirement(r)) for r in metadata.get_all("Requires-Dist")} == {str(Requirement(r)) for r in required}
