"""Code mode's figures (docs/benchmarks.md, "Code mode"):

- search quality: recall@1/@5/@10 of switchboard__search_tools' ranking, lexical alone and combined with
  the embeddings, on bench/search_eval.json over the real catalogs in bench/catalogs (each catalog an
  upstream named after its file); and how long embedding the catalog takes;
- search latency: one query (its embedding included, when combined), at the real catalog's size and at
  5,000 tools (the catalogs repeated under other namespaces), with the per-agent filter a real query pays;
  and the lexical index's build;
- context saved: tokens (o200k_base) of the full tools/list against the two code-mode tools plus a typical
  search result, for 50, 150 and 500 tools;
- the sandbox: an execution that returns at once, and the cost per tool call of the stdio protocol.

    bench/run code_mode     # or .venv/bin/python bench/code_mode.py
"""

import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gateway_project.settings")

import django  # noqa: E402
import numpy as np  # noqa: E402

django.setup()

from bpe_openai import get_encoding  # noqa: E402

from handoff.codemode.bindings import bindings_build  # noqa: E402
from handoff.codemode.sandbox import SandboxLimits, sandbox_run  # noqa: E402
from handoff.codemode.search import Embedder, SearchIndex  # noqa: E402
from handoff.codemode.tools import execute_definition, search_tools_definition  # noqa: E402
from handoff.codemode.typescript import method_declaration  # noqa: E402

CATALOGS = Path(__file__).parent / "catalogs"
TYPICAL_QUERY = "list recent commits of a GitHub repository"


def catalog(copies: int = 1) -> list[dict]:
    """Every real tool under its exposed name; further copies under other namespaces (`github2__...`)."""
    tools = []
    for copy in range(copies):
        for path in sorted(CATALOGS.glob("*.json")):
            namespace = path.stem + (str(copy + 1) if copy else "")
            for tool in json.loads(path.read_text())["tools"]:
                tools.append(tool | {"name": f"{namespace}__{tool['name']}", "_slug": namespace, "_tool": tool["name"]})
    return tools


def evaluation() -> list[dict]:
    return json.loads((Path(__file__).parent / "search_eval.json").read_text())["queries"]


def recall(embedder: Embedder) -> None:
    queries, tools = evaluation(), catalog()
    index = SearchIndex(tools)
    started = time.perf_counter()
    embedder.fill(index)  # here rather than in its thread: this is what is measured
    embedding = time.perf_counter() - started
    vectors = [embedder.query(query["query"]) for query in queries]
    servers = len(list(CATALOGS.glob("*.json")))
    print(f"\n{len(queries)} queries over {len(tools)} tools from {servers} servers")
    print(f"(embedding the catalog: {embedding:.1f} s, once per process and catalog, in the background)\n")
    print("| ranking | recall@1 | recall@5 | recall@10 |\n|---|---|---|---|")
    for ranking, use in (("lexical (BM25)", False), ("lexical + semantic", True)):
        cells = []
        for k in (1, 5, 10):
            shares = []
            for query, vector in zip(queries, vectors, strict=True):
                hits = index.search(query["query"], k, lambda name: True, vector if use else None)
                shares.append(len(set(hits) & set(query["expected"])) / min(k, len(query["expected"])))
            cells.append(f"{statistics.mean(shares):.3f}")
        print(f"| {ranking} | {' | '.join(cells)} |")


def latency(embedder: Embedder) -> None:
    print("\n| tools | index build (ms) | query, lexical p50 / p90 (ms) | query, combined p50 / p90 (ms) |")
    print("|---|---|---|---|")
    queries = [query["query"] for query in evaluation()]
    vectors = [embedder.query(query) for query in queries]
    for tools in (catalog(), catalog(13)[:5000]):
        started = time.perf_counter()
        index = SearchIndex(tools)
        build = (time.perf_counter() - started) * 1000
        # Vectors for 5,000 tools without embedding copies again: the real ones, repeated.
        real = SearchIndex(catalog())
        embedder.fill(real)
        index.vectors = np.resize(real.vectors, (len(tools), real.vectors.shape[1]))
        permitted = {tool["name"]: True for tool in tools}  # what Snapshot.decide's memo costs per name
        cells = []
        for use in (False, True):
            times = []
            for _ in range(5):
                for query, vector in zip(queries, vectors, strict=True):
                    started = time.perf_counter()
                    if use:
                        vector = embedder.query(query)
                    index.search(query, 5, permitted.__getitem__, vector if use else None)
                    times.append((time.perf_counter() - started) * 1000)
            cuts = statistics.quantiles(times, n=10)
            cells.append(f"{statistics.median(times):.2f} / {cuts[8]:.2f}")
        print(f"| {len(tools)} | {build:.0f} | {' | '.join(cells)} |")


def context() -> None:
    encoding = get_encoding("o200k_base")

    def tokens(value: object) -> int:
        return len(encoding.encode(json.dumps(value)))

    tools = catalog(2)
    two = tokens([search_tools_definition(), execute_definition()])
    print("\n| tools | full tools/list (tokens) | search_tools + execute (tokens) | + one search result, k=5 | saved |")
    print("|---|---|---|---|---|")
    for count in (50, 150, 500):
        offered = tools[:count]
        listed = [{key: t[key] for key in ("name", "description", "inputSchema") if key in t} for t in offered]
        index = SearchIndex(offered)
        bindings = bindings_build([(t["name"], t["_slug"], t["_tool"]) for t in offered])
        found = []
        for name in index.search(TYPICAL_QUERY, 5, lambda name: True):
            binding, tool = bindings.by_name.get(name), next(t for t in offered if t["name"] == name)
            signature = method_declaration(binding.path, tool, name) if binding else ""
            found.append(f"// {name}\n{signature}")
        result = tokens("\n\n".join(found))
        full = tokens(listed)
        print(f"| {count} | {full} | {two} | {two + result} | {1 - (two + result) / full:.0%} |")


async def sandbox() -> None:
    limits = SandboxLimits(timeout=30, heap_mb=128, max_calls=1000, max_output_bytes=1_000_000)
    bindings = bindings_build([("bench__noop", "bench", "noop")])

    async def answer(binding, arguments):
        return {"ok": True, "value": arguments}

    async def timed(code: str, runs: int) -> float:
        times = []
        for _ in range(runs):
            started = time.perf_counter()
            await sandbox_run(code=code, bindings=bindings, call=answer, limits=limits)
            times.append((time.perf_counter() - started) * 1000)
        return statistics.median(times)

    empty = await timed("return 1;", 20)
    calls = await timed("for (let i = 0; i < 200; i++) await tools.bench.noop({ i });", 10)
    print("\n| sandbox | p50 |\n|---|---|")
    print(f"| an execution that returns at once (Deno started and ended) | {empty:.1f} ms |")
    print(f"| each tool call's round trip over stdio (200 sequential calls) | {(calls - empty) / 200 * 1000:.0f} µs |")


if __name__ == "__main__":
    embedder = Embedder()
    recall(embedder)
    latency(embedder)
    context()
    asyncio.run(sandbox())
