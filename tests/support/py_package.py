"""A Python package of the tests' own, built as a wheel that `uvx --from <wheel> switchboard-py-echo` runs:
tests/support/py_echo's server, at the version a test asks for (tests/test_packages.py). No index is involved."""

import subprocess
import sys
import tempfile
from pathlib import Path

SOURCE = Path(__file__).parent / "py_echo" / "switchboard_py_echo.py"
NAME = "switchboard-py-echo"


def build(folder: Path, version: str, mark: str = "") -> Path:
    """Builds the server at `version` into `folder` (replacing a wheel of that version there), its module marked
    `mark` (another build of the same version, other contents); the wheel."""
    with tempfile.TemporaryDirectory() as unpacked:
        module = SOURCE.read_text().replace('MARK = ""', f"MARK = {mark!r}")
        Path(unpacked, SOURCE.name).write_text(module)
        info = Path(unpacked) / f"switchboard_py_echo-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {NAME}\nVersion: {version}\n")
        (info / "WHEEL").write_text("Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        (info / "entry_points.txt").write_text(f"[console_scripts]\n{NAME} = switchboard_py_echo:main\n")
        subprocess.run([sys.executable, "-m", "wheel", "pack", unpacked, "-d", folder], check=True, capture_output=True)
    return folder / f"switchboard_py_echo-{version}-py3-none-any.whl"
