"""Load shedding (issue 24, item 4): one web process at ten times its configured capacity.

One inline gateway under uvicorn (the production server), PostgreSQL audit and Redis, its capacity set to
`--capacity` POSTs in flight (GATEWAY_MAX_IN_FLIGHT); the demo stdio upstream. `--sessions` measured SDK
client sessions call `demo__echo` back to back, first alone (the unloaded p99), then while a flood of ten times
the capacity runs in another process (so that the flood's own CPU is not the measuring loop's), one kind at a
time:

- calls:  10 x capacity raw HTTP clients, each POSTing `tools/call demo__sleep` (0.2 s) back to back, retrying
          at once when refused: more concurrent calls than the process admits;
- bodies: 10 x capacity clients POSTing 2 MiB bodies (twice GATEWAY_MAX_BODY_BYTES);
- headers: 10 x capacity clients sending 100 KiB of headers;
- slow:   10 x capacity clients that send their headers and then a byte of body every 0.5 s.

Reported per kind: how the flood's requests were answered (status counts) and how fast a refusal came (p50,
p99), the measured sessions' admitted calls (p99 against the unloaded p99) and how many of theirs were shed.
Bars (issue 24): refusals within 50 ms as 429/503 with Retry-After; admitted p99 <= 1.2x unloaded; nothing falls
over (the gateway answers after every kind).

    bench/run shed --capacity 16 --seconds 10      # figures: bench/results/shed.json, the gateway's log beside it
"""

import argparse
import asyncio
import json
import multiprocessing
import os
import socket
import statistics
import sys
import time
from pathlib import Path

import httpx2

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from run import http_session, setup_database  # noqa: E402  (bench/run.py: the same data and environment)

from tests import servers  # noqa: E402  (the process helpers the tests use)
from tests.clients import STATELESS_META  # noqa: E402

KINDS = ("calls", "bodies", "headers", "slow")
ACCEPT = "application/json, text/event-stream"


def _call_body(tool: str, arguments: dict) -> bytes:
    """A 2026-07-28 tools/call: one request, no session (tests/clients.py stateless_call)."""
    params = {"name": tool, "arguments": arguments, "_meta": STATELESS_META}
    return json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}).encode()


def _call_headers(key: str, tool: str) -> dict[str, str]:
    return {
        "authorization": f"Bearer {key}",
        "accept": ACCEPT,
        "content-type": "application/json",
        "mcp-protocol-version": "2026-07-28",
        "mcp-method": "tools/call",
        "mcp-name": tool,
    }


async def _flooder(kind: str, url: str, key: str, until: float, answers: list, hostile: bool) -> None:
    """One flooding client: requests of its kind back to back until `until`; (status, seconds, retry-after)."""
    if kind == "slow":
        return await _slow(url, key, until, answers)
    tool = "demo__sleep" if kind == "calls" else "demo__echo"
    headers = _call_headers(key, tool)
    body = _call_body(tool, {"seconds": 0.2} if kind == "calls" else {"text": "x"})
    if kind == "bodies":
        body = b" " * (2 * 1024 * 1024)
    if kind == "headers":
        headers |= {f"x-filler-{n}": "y" * 1000 for n in range(100)}
    async with httpx2.AsyncClient(timeout=30) as http:
        while time.monotonic() < until:
            started = time.monotonic()
            try:
                answer = await http.post(f"{url}/mcp", content=body, headers=headers)
                retry = answer.headers.get("retry-after")
                answers.append((answer.status_code, time.monotonic() - started, retry))
                if retry and not hostile:  # a client that does as it is told
                    await asyncio.sleep(float(retry))
            except httpx2.HTTPError as exc:
                answers.append((type(exc).__name__, time.monotonic() - started, None))


async def _slow(url: str, key: str, until: float, answers: list) -> None:
    """Headers, then a byte of a 64-byte body every half second: a client that holds its request open."""
    host, port = url.removeprefix("http://").split(":")
    while time.monotonic() < until:
        started = time.monotonic()
        try:
            reader, writer = await asyncio.open_connection(host, int(port))
            head = (
                f"POST /mcp HTTP/1.1\r\nHost: {host}:{port}\r\nAuthorization: Bearer {key}\r\nAccept: {ACCEPT}\r\n"
                "Content-Type: application/json\r\nContent-Length: 64\r\n\r\n"
            )
            writer.write(head.encode())
            await writer.drain()
            status = None
            for _ in range(64):
                if time.monotonic() >= until:
                    break
                writer.write(b" ")
                await writer.drain()
                try:
                    line = await asyncio.wait_for(reader.readline(), 0.5)  # the trickle's pace, and a read
                except TimeoutError:
                    continue
                status = int(line.split()[1]) if line.startswith(b"HTTP/") else "closed"
                break
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5) if status not in (None, "closed") else b""
            retry = b"retry-after:" in head.lower()
            answers.append((status or "held", time.monotonic() - started, "1" if retry else None))
            writer.close()
        except OSError as exc:
            answers.append((type(exc).__name__, time.monotonic() - started, None))


def flood(
    kind: str, url: str, key: str, clients: int, seconds: float, hostile: bool, out: "multiprocessing.Queue"
) -> None:
    """In a process of its own: `clients` flooders of `kind` for `seconds`; their answers onto `out`."""
    answers: list = []
    until = time.monotonic() + seconds

    async def main() -> None:
        await asyncio.gather(*(_flooder(kind, url, key, until, answers, hostile) for _ in range(clients)))

    asyncio.run(main())
    out.put(answers)


async def probe(url: str, key: str, seconds: float) -> list:
    """One request at a time (a call that would be admitted if there were room), as a client that is not part
    of the flood sees the door: (status, seconds, retry-after) each."""
    answers: list = []
    until = time.monotonic() + seconds
    body, headers = _call_body("demo__echo", {"text": "probe"}), _call_headers(key, "demo__echo")
    async with httpx2.AsyncClient(timeout=30) as http:
        while time.monotonic() < until:
            started = time.monotonic()
            answer = await http.post(f"{url}/mcp", content=body, headers=headers)
            answers.append((answer.status_code, time.monotonic() - started, answer.headers.get("retry-after")))
            await asyncio.sleep(0.05)  # the probe's pace: it samples the door, it does not add to the flood
    return answers


async def measured(url: str, key: str, sessions: int, seconds: float) -> tuple[list[float], int]:
    """`sessions` SDK sessions calling demo__echo for `seconds`: admitted calls' times, and how many were shed."""
    times, shed = [], 0
    until = time.monotonic() + seconds

    async def one() -> None:
        nonlocal shed
        while time.monotonic() < until:
            try:
                async with http_session(f"{url}/mcp", {"Authorization": f"Bearer {key}"}) as client:
                    while time.monotonic() < until:
                        started = time.monotonic()
                        result = await client.call_tool("demo__echo", {"text": "measured"})
                        assert not result.is_error, result
                        times.append(time.monotonic() - started)
            except Exception:  # shed (503) while opening the session or on a call: counted, and opened again
                shed += 1
                await asyncio.sleep(0.05)  # pacing before the next try, as Retry-After would ask (and more)

    await asyncio.gather(*(one() for _ in range(sessions)))
    return times, shed


def p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100)[98] if len(values) >= 2 else float("nan")


def summary(answers: list) -> dict:
    statuses: dict[str, int] = {}
    for status, _, _ in answers:
        statuses[str(status)] = statuses.get(str(status), 0) + 1
    refused = [(s, t, r) for s, t, r in answers if s in (429, 503)]
    refusal_times = [t for _, t, _ in refused]
    return {
        "statuses": statuses,
        "refusals": len(refused),
        "refusals_with_retry_after": sum(1 for _, _, r in refused if r),
        "refusal_p50_ms": statistics.median(refusal_times) * 1000 if refusal_times else None,
        "refusal_p99_ms": p99(refusal_times) * 1000 if len(refusal_times) > 1 else None,
        "other_errors_p99_ms": p99([t for s, t, _ in answers if s in (413, 431, 400)]) * 1000
        if sum(1 for s, _, _ in answers if s in (413, 431, 400)) > 1
        else None,
    }


def run_all(url: str, key: str, args: argparse.Namespace) -> dict:
    results: dict = {}
    unloaded, _ = asyncio.run(measured(url, key, args.sessions, args.seconds))
    results["unloaded"] = {
        "calls": len(unloaded),
        "p50_ms": statistics.median(unloaded) * 1000,
        "p99_ms": p99(unloaded) * 1000,
    }
    print(f"unloaded: {results['unloaded']}", file=sys.stderr)
    for kind in args.kinds.split(","):
        out: multiprocessing.Queue = multiprocessing.Queue()
        flooding = multiprocessing.Process(
            target=flood, args=(kind, url, key, args.capacity * 10, args.seconds + 1, args.hostile, out), daemon=True
        )
        flooding.start()

        async def both() -> tuple:
            return await asyncio.gather(measured(url, key, args.sessions, args.seconds), probe(url, key, args.seconds))

        (admitted, shed), probed = asyncio.run(both())
        answers = out.get(timeout=args.seconds + 60)
        flooding.join(timeout=30)
        after, _ = asyncio.run(measured(url, key, 1, 1.0))  # still serving once the flood is over
        results[kind] = summary(answers) | {
            "probe": summary(probed),
            "admitted_calls": len(admitted),
            "admitted_p99_ms": p99(admitted) * 1000,
            "admitted_p99_over_unloaded": p99(admitted) / p99(unloaded),
            "measured_shed": shed,
            "served_after": len(after) > 0,
        }
        print(f"{kind}: {json.dumps(results[kind])}", file=sys.stderr)
    return results


def table(results: dict) -> str:
    lines = [
        f"Unloaded: {results['unloaded']['calls']} calls, p50 {results['unloaded']['p50_ms']:.2f} ms, "
        f"p99 {results['unloaded']['p99_ms']:.2f} ms.",
        "",
        "| flood | its answers | its refusals p50 / p99 ms (with Retry-After) | a probe's answers | the probe's "
        "refusals p50 / p99 ms | admitted p99 ms | / unloaded | measured calls shed | served after |",
        "|---|---|---|---|---|---:|---:|---:|---|",
    ]
    for kind in KINDS:
        if kind not in results:
            continue
        r = results[kind]
        answers = ", ".join(f"{k}: {v}" for k, v in sorted(r["statuses"].items(), key=lambda kv: -kv[1]))
        refusal = (
            f"{r['refusal_p50_ms']:.1f} / {r['refusal_p99_ms']:.1f} "
            f"({r['refusals_with_retry_after']} of {r['refusals']})"
            if r["refusal_p99_ms"] is not None
            else "none"
        )
        probe_answers = ", ".join(f"{k}: {v}" for k, v in sorted(r["probe"]["statuses"].items(), key=lambda kv: -kv[1]))
        p = r["probe"]
        probe_refusal = f"{p['refusal_p50_ms']:.1f} / {p['refusal_p99_ms']:.1f}" if p["refusal_p99_ms"] else "none"
        lines.append(
            f"| {kind} | {answers} | {refusal} | {probe_answers} | {probe_refusal} "
            f"| {r['admitted_p99_ms']:.2f} | {r['admitted_p99_over_unloaded']:.2f} "
            f"| {r['measured_shed']} | {'yes' if r['served_after'] else '**no**'} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--capacity", type=int, default=16, help="GATEWAY_MAX_IN_FLIGHT; the flood is ten times it")
    parser.add_argument("--sessions", type=int, default=2, help="measured sessions")
    parser.add_argument("--seconds", type=float, default=10.0, help="each phase's length")
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--hostile", action="store_true", help="the flood retries at once instead of after Retry-After")
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/shed.json")
    args = parser.parse_args()
    logs = args.out.parent
    logs.mkdir(parents=True, exist_ok=True)
    key = setup_database()
    env = dict(os.environ) | {"GATEWAY_EXECUTOR": "inline", "GATEWAY_MAX_IN_FLIGHT": str(args.capacity)}
    gateway = servers.start_gateway_under(servers.UVICORN, env, logs / "shed-gateway.log")
    try:
        results = run_all(gateway.url, key, args)
    finally:
        gateway.stop()
    args.out.write_text(json.dumps(results, indent=2))
    print(table(results))


if __name__ == "__main__":
    socket.setdefaulttimeout(30)
    main()
