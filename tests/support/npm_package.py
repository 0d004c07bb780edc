"""An npm package of the tests' own, packed into a tarball that `npx -y <tarball>` runs: tests/support/npm_echo's
server, at the version a test asks for (tests/test_packages.py). No registry is involved."""

import json
import shutil
import subprocess
import tempfile
from pathlib import Path

SOURCE = Path(__file__).parent / "npm_echo"
NAME = "switchboard-npm-echo"


def pack(tarball: Path, version: str) -> Path:
    """Packs the server at `version` into `tarball` (replacing what is there); the tarball."""
    with tempfile.TemporaryDirectory() as folder:
        shutil.copy(SOURCE / "server.js", folder)
        manifest = {"name": NAME, "version": version, "bin": {NAME: "server.js"}, "license": "Apache-2.0"}
        Path(folder, "package.json").write_text(json.dumps(manifest))
        command = ["npm", "pack", "--json", "--pack-destination", folder]
        packed = subprocess.run(command, cwd=folder, capture_output=True, text=True, check=True)
        shutil.move(Path(folder) / json.loads(packed.stdout)[0]["filename"], tarball)
    return tarball
