"""A process of the gateway keeps glibc's malloc to two arenas (gateway_project/__init__.py): with one arena a
thread, up to eight a core, a process's RSS kept every arena's high-water mark and grew in steps under the soak."""

import os
import subprocess
import sys

import pytest

from tests.servers import ROOT

SCRIPT = """
import ctypes, os, sys, tempfile, threading
if sys.argv[1] == "gateway":
    import gateway_project  # first, as in every process of the gateway

libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.fopen.restype = ctypes.c_void_p
ready = threading.Barrier(9)

def allocate():
    libc.malloc(4096)  # past pymalloc's small objects: glibc's malloc, from this thread's arena
    ready.wait()  # every thread alive at once, so none takes over an ended thread's arena
    ready.wait()

threads = [threading.Thread(target=allocate) for _ in range(8)]
for thread in threads:
    thread.start()
ready.wait()
path = tempfile.mktemp()
report = libc.fopen(path.encode(), b"w")
libc.malloc_info(0, ctypes.c_void_p(report))
libc.fclose(ctypes.c_void_p(report))
ready.wait()
print(open(path).read().count("<heap nr="))
os.unlink(path)
"""


def arenas(kind: str) -> int:
    env = {name: value for name, value in os.environ.items() if name != "MALLOC_ARENA_MAX"}
    ran = subprocess.run(
        [sys.executable, "-c", SCRIPT, kind], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert ran.returncode == 0, ran.stderr
    return int(ran.stdout)


@pytest.mark.skipif("glibc" not in (os.confstr("CS_GNU_LIBC_VERSION") or ""), reason="glibc's malloc only")
def test_eight_threads_that_allocate_share_two_arenas_in_a_process_of_the_gateway():
    assert arenas("plain") > 2  # glibc's default: an arena a thread (so this test can fail)
    assert arenas("gateway") == 2
