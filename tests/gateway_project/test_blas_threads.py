"""A subprocess forked while NumPy multiplies in another thread (code mode's embeddings run in a thread of the web
process) must not hang the process: uvloop, uvicorn's loop, forks with fork(), which runs OpenBLAS's fork handler,
and that handler waits for OpenBLAS's own threads (gateway_project/__init__.py keeps it to one)."""

import os
import subprocess
import sys

from tests.servers import ROOT

SCRIPT = """
import asyncio, threading
import gateway_project  # first, as in every process of the gateway
import numpy as np, uvloop

done = threading.Event()

def multiply():
    matrix = np.random.rand(400, 400)
    while not done.is_set():
        matrix @ matrix

async def spawn():
    threading.Thread(target=multiply, daemon=True).start()
    for _ in range(100):
        process = await asyncio.create_subprocess_exec("/bin/true")
        await process.wait()

uvloop.run(spawn())
done.set()
print("spawned")
"""


def test_subprocesses_forked_by_uvloop_while_numpy_multiplies_in_another_thread_do_not_hang():
    env = {name: value for name, value in os.environ.items() if name != "OPENBLAS_NUM_THREADS"}  # as started
    ran = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert (ran.returncode, ran.stdout, ran.stderr) == (0, "spawned\n", "")
