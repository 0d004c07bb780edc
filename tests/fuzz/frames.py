"""Fuzz target: what an agent sends as one frame, as `/mcp` reads a POST body (bytes) and as `/mcp/ws` reads a
text frame (str), through the checks every transport makes (`parse_frame`, then the SDK's JSON-RPC shapes) and
back out (`encode_message`, `FrameError.body`). Bad input may only end as a FrameError with a JSON-RPC code
or as the "does not match any JSON-RPC 2.0 shape" answer; any other exception is a defect, and so is an
answer that is not JSON.

    .venv/bin/python -m tests.fuzz.frames -max_total_time=60 tests/fuzz/corpus/frames   (libFuzzer's flags)
"""

import os
import sys

import atheris
import django

# Instrumented as they are first imported, so before Django's setup imports them uninstrumented.
with atheris.instrument_imports(include=["handoff.mcp.frames", "gateway_project.lib.json_depth"]):
    from tests.fuzz.checks import check_frame

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
django.setup()


def TestOneInput(data: bytes) -> None:  # noqa: N802 (libFuzzer's name)
    check_frame(data)
    check_frame(data.decode("utf-8", "replace"))  # what /mcp/ws makes of a binary frame


if __name__ == "__main__":
    atheris.Setup(sys.argv, TestOneInput)
    atheris.Fuzz()
