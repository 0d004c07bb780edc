"""What one OpenBLAS thread costs code mode's encoder (gateway_project/__init__.py sets OPENBLAS_NUM_THREADS=1,
so that uvloop's fork cannot hang on OpenBLAS's fork handler): a query's embedding and a catalog batch of 32 tool
texts, in fresh processes with one thread and with OpenBLAS's default (a thread per core), interleaved round by
round with the order turned. The variable is read when NumPy loads, hence a process per measurement.

    .venv/bin/python bench/blas_threads.py --rounds 4
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHILD = """
import json, sys, time
sys.path.insert(0, sys.argv[1])
from handoff.codemode.embeddings import encoder  # NumPy alone, not gateway_project, which sets the variable

model = encoder()
queries = [f"find the weather forecast for city number {i} and convert its units" for i in range(60)]
tools = [f"tool {i}: reads rows from a table, filters them by a column, returns the first page" for i in range(64)]
model.embed(queries[:2])  # warm-up
times = []
for text in queries:
    start = time.perf_counter()
    model.embed([text])
    times.append((time.perf_counter() - start) * 1000)
batches = []
for first in range(0, len(tools), 32):
    start = time.perf_counter()
    model.embed(tools[first : first + 32])
    batches.append((time.perf_counter() - start) * 1000)
print(json.dumps({"query": sorted(times)[len(times) // 2], "batch": sum(batches) / len(batches)}))
"""


def measure(threads: str) -> dict[str, float]:
    env = {name: value for name, value in os.environ.items() if name != "OPENBLAS_NUM_THREADS"}
    if threads != "default":
        env["OPENBLAS_NUM_THREADS"] = threads
    ran = subprocess.run([sys.executable, "-c", CHILD, str(ROOT)], env=env, capture_output=True, text=True, check=True)
    return json.loads(ran.stdout.splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    results: dict[str, list[dict[str, float]]] = {"1": [], "default": []}
    for round_ in range(args.rounds):
        for threads in ("1", "default") if round_ % 2 == 0 else ("default", "1"):
            results[threads].append(measure(threads))
    print(f"Medians of {args.rounds} rounds:\n")
    print("| OpenBLAS threads | a query's embedding, p50 ms | a batch of 32, mean ms |")
    print("|---|---:|---:|")
    for threads, rows in results.items():
        query = statistics.median(row["query"] for row in rows)
        batch = statistics.median(row["batch"] for row in rows)
        print(f"| {threads} | {query:.2f} | {batch:.1f} |")


if __name__ == "__main__":
    main()
