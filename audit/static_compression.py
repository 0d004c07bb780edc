"""The console's collected static files compressed (Brotli and gzip copies beside each, for WhiteNoise), each copy
written whole or not at all: run as `python -m audit.static_compression <static root>` by `static_ready --later`,
in a process of its own that runs only on an idle core, so that the demo's first start does not wait the seconds
Brotli's best level takes. It marks the root done (`<root>.compressed`) last: a run stopped before (the demo's
Ctrl-C stops it too) is taken up by the next start. Needs no Django: the process it runs in stays small and quick
to start."""

import os
import sys
from pathlib import Path

from whitenoise.compress import Compressor


class WholeCompressor(Compressor):
    """WhiteNoise's, writing each copy under another name first: a copy cut short by a kill is never served."""

    def write_data(self, path: str, data: bytes, suffix: str, stat_result: os.stat_result) -> str:
        part = super().write_data(path, data, f"{suffix}.part", stat_result)
        os.replace(part, path + suffix)
        return path + suffix


def compressed_mark(root: Path) -> Path:
    """The file whose presence says every file under `root` has its copies."""
    return root.with_name(f"{root.name}.compressed")


def static_compress(root: Path) -> None:
    """Compresses every file under `root` that has no copies yet (a copy left half-written by a kill is removed),
    then marks the root done."""
    compressor = WholeCompressor(quiet=True)
    for path in sorted(root.rglob("*")):
        if path.suffix == ".part":
            path.unlink(missing_ok=True)
        elif path.is_file() and compressor.should_compress(path.name) and not Path(f"{path}.br").exists():
            compressor.compress(str(path))
    compressed_mark(root).touch()


if __name__ == "__main__":
    # Only on a core nothing else wants: the demo's first start (Django, its upstreams) runs meanwhile, and a
    # nice level still takes a tenth of a busy core.
    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    static_compress(Path(sys.argv[1]))
