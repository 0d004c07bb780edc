"""The fault campaign (issue 24, item 1): calls run at load through both executors while, one at a time, a
Celery worker is killed mid-call, Redis restarts empty, PostgreSQL restarts, the stdio upstreams are killed or
hang, and the web processes are killed. Then the audit is accounted for.

What runs, all on 127.0.0.1 and all of its own (so that nothing else on the machine is touched): a database
`switchboard_faults` reached through a TCP relay (tests/servers.py TcpProxy: a PostgreSQL "restart" drops every
connection and refuses new ones for a while, for these processes only), a private `redis-server` on a free port
(restarted for real, empty), an inline gateway and a Celery gateway with its worker and beat (Daphne), the demo
stdio upstream (as `faulty`, timeout 3 s). `--sessions` SDK client sessions per gateway call `faulty__sleep` (0.2 s,
so that calls are in flight when a fault strikes) and `faulty__echo` in turn, reopening their session when it
breaks. Each fault: load for `--settle` s, the fault for `--seconds` s, then load until both gateways answered
again (bounded), then `--settle` s more.

Per fault it reports the calls that overlapped it by outcome, the longest any call waited beyond its deadline
(the upstream's timeout + the connect timeout + the executor's grace: what the gateway promises an agent), and
how long after the fault ended each gateway served a call again. At the end: every `approved` row of the
campaign must have a `completed` row (an outcome, or `unknown` from the sweep) within `--account` s. Bars
(issue 24): served again within 30 s (a killed stdio upstream: 5 s), no wait past the deadline, nothing open.
The sweep runs every 5 s with 10 s of grace here (defaults 60 and 60), so that it settles within the bound.

    bench/run faults                                   # every fault (about 4 minutes)
    bench/run faults --faults upstream_kill,redis_restart --seconds 2 --settle 2     # a slice
"""

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from urllib.parse import urlsplit

import anyio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gateway_project.settings")
os.environ["GATEWAY_EXECUTOR"] = "inline"  # this process syncs the catalog itself; the gateways get their own

from tests import servers  # noqa: E402  (the process helpers the tests use)
from tests.clients import sdk_client  # noqa: E402

FAULTS = ("worker_kill", "redis_restart", "postgres_restart", "upstream_kill", "upstream_hang", "web_kill")
TIMEOUT = 3.0  # the demo upstream's call timeout
CONNECT = 2.0
DEADLINE = TIMEOUT + CONNECT + 5.0  # audit/outcomes.py call_deadline: how long the gateway waits at most
MARGIN = 1.0  # what an answer at the deadline takes to reach the client (the HTTP round trip, the SDK's parse)
SWEEP = {"GATEWAY_AUDIT_CHECKPOINT_SECONDS": "5", "GATEWAY_AUDIT_OUTCOME_GRACE_SECONDS": "10"}
RECOVERY_BOUND = 60.0  # how long the campaign waits for a gateway to serve again before it calls it failed
SLUG = "faulty"  # the demo upstream under a slug of its own: the campaign may run in the tests' database
BARS = {"upstream_kill": 5.0}  # seconds to serve again; any other fault 30
DEFAULT_BAR = 30.0


@dataclass
class Call:
    gateway: str
    started: float
    ended: float
    outcome: str


class Campaign:
    def __init__(self, env: dict[str, str], logs: Path, redis_port: int, proxy: servers.TcpProxy) -> None:
        self.env, self.logs, self.redis_port, self.proxy, self.key = env, logs, redis_port, proxy, ""
        self.redis = self._redis()
        self.gateways: dict[str, servers.Running] = {}
        self.worker = self.beat = None
        self.calls: list[Call] = []
        self.restarts: list[tuple[float, str, int | None]] = []  # (when, what, its exit status): the supervisor's

    def _redis(self) -> subprocess.Popen:
        command = ["redis-server", "--port", str(self.redis_port), "--save", "", "--appendonly", "no"]
        process = servers.start(command, self.env, self.logs / "faults-redis.log")
        servers.wait_for_port(self.redis_port, process, self.logs / "faults-redis.log")
        return process

    def start(self) -> None:
        celery = self.env | {"GATEWAY_EXECUTOR": "celery"}
        self.worker = servers.start_worker(celery, self.logs / "faults-worker.log")
        schedule = self.logs / "faults-beat-schedule"
        beat_log = self.logs / "faults-beat.log"
        self.beat = servers.Running(
            servers.start([*servers.CELERY, "beat", "-s", str(schedule)], celery, beat_log), beat_log
        )
        self.gateways["inline"] = servers.start_gateway(
            self.env | {"GATEWAY_EXECUTOR": "inline"}, self.logs / "faults-inline.log"
        )
        self.gateways["celery"] = servers.start_gateway(celery, self.logs / "faults-celery.log")

    def stop(self) -> None:
        for running in [*self.gateways.values(), self.worker, self.beat]:
            if running is not None:
                running.stop()
        self.redis.kill()
        self.redis.wait(timeout=10)

    # --- the faults: each returns when the fault is over (the thing restarted or restored) -------------------

    async def worker_kill(self, seconds: float) -> None:
        killed, self.worker = self.worker, None  # the supervisor leaves it down for the fault's length
        os.killpg(killed.process.pid, signal.SIGKILL)  # with its stdio upstreams
        killed.process.wait(timeout=10)
        await asyncio.sleep(seconds)  # the fault's length: no worker at all meanwhile
        self.worker = await asyncio.to_thread(
            servers.start_worker, self.env | {"GATEWAY_EXECUTOR": "celery"}, self.logs / "faults-worker.log"
        )

    async def redis_restart(self, seconds: float) -> None:
        self.redis.kill()
        self.redis.wait(timeout=10)
        await asyncio.sleep(seconds)
        self.redis = await asyncio.to_thread(self._redis)

    async def postgres_restart(self, seconds: float) -> None:
        self.proxy.cut()
        await asyncio.sleep(seconds)
        self.proxy.restore()

    def _upstreams(self) -> list[int]:
        """The demo upstream's processes (under the inline gateway and under the worker)."""
        found = subprocess.run(["pgrep", "-f", "examples/demo_upstream.py"], capture_output=True, text=True)
        owners = {self.gateways["inline"].process.pid} | ({self.worker.process.pid} if self.worker else set())
        return [int(pid) for pid in found.stdout.split() if _parent(int(pid)) in owners]

    async def upstream_kill(self, seconds: float) -> None:
        for pid in self._upstreams():
            os.kill(pid, signal.SIGKILL)

    async def upstream_hang(self, seconds: float) -> None:
        hung = self._upstreams()
        for pid in hung:
            os.kill(pid, signal.SIGSTOP)
        await asyncio.sleep(seconds)
        for pid in hung:
            os.kill(pid, signal.SIGCONT)

    async def web_kill(self, seconds: float) -> None:
        ports = {name: int(urlsplit(g.url).port) for name, g in self.gateways.items()}
        for running in self.gateways.values():
            os.killpg(running.process.pid, signal.SIGKILL)
            running.process.wait(timeout=10)
        await asyncio.sleep(seconds)
        for name, port in ports.items():
            env = self.env | {"GATEWAY_EXECUTOR": name}
            log = self.logs / f"faults-{name}.log"
            self.gateways[name] = await asyncio.to_thread(servers.start_gateway, env, log, port)

    async def supervise(self, stop: asyncio.Event) -> None:
        """What a deployment's supervisor (systemd's Restart=always, Kubernetes) does: a worker, beat or web
        process that exited on its own is started again, and the campaign records it."""
        while not stop.is_set():
            await asyncio.sleep(0.5)  # the supervisor's polling interval
            if self.worker is not None and (status := self.worker.process.poll()) is not None:
                self.restarts.append((time.monotonic(), "worker", status))
                env = self.env | {"GATEWAY_EXECUTOR": "celery"}
                self.worker = await asyncio.to_thread(servers.start_worker, env, self.logs / "faults-worker.log")

    # --- the load -------------------------------------------------------------------------------------------

    async def load(self, name: str, stop: asyncio.Event) -> None:
        """One session's calls, reopened when it breaks; every call recorded with its outcome."""
        turn = 0
        while not stop.is_set():
            last = time.monotonic()  # when the session's latest call (or its opening) began
            try:
                async with sdk_client(self.gateways[name].url, self.key, "legacy", timeout=DEADLINE + 5) as client:
                    while not stop.is_set():
                        turn += 1
                        tool, arguments = (
                            (f"{SLUG}__sleep", {"seconds": 0.2}) if turn % 2 else (f"{SLUG}__echo", {"text": "x"})
                        )
                        started = last = time.monotonic()
                        try:
                            with anyio.fail_after(DEADLINE + 5):
                                result = await client.call_tool(tool, arguments)
                            outcome = "ok" if not result.is_error else f"tool error: {result.content[0].text[:50]}"
                        except TimeoutError:
                            outcome = "hung past the deadline"
                        except Exception as exc:
                            outcome = _refusal(exc)
                        self.calls.append(Call(name, started, time.monotonic(), outcome))
                        # Gone from the gateway (404, -32600: its record went with Redis): a client opens another.
                        if outcome.startswith("session") or outcome == "error -32600":
                            break
            except Exception as exc:  # the gateway went away under the session: open another
                self.calls.append(Call(name, last, time.monotonic(), f"session: {type(exc).__name__}"))
            if not stop.is_set():
                await asyncio.sleep(0.2)  # pacing before a new session, so that a dead gateway is not hammered

    def served_since(self, name: str, moment: float) -> float | None:
        return next(
            (c.ended for c in self.calls if c.gateway == name and c.started >= moment and c.outcome == "ok"), None
        )


def _parent(pid: int) -> int | None:
    """/proc/<pid>/stat: "pid (comm) state ppid ...", comm may hold spaces (as tests/helpers.py parent_pid reads it,
    which needs Django set up)."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):  # gone meanwhile
        return None


def _refusal(exc: BaseException) -> str:
    from mcp.shared.exceptions import MCPError

    if isinstance(exc, MCPError):
        data = exc.error.data if isinstance(exc.error.data, dict) else {}
        return f"error {exc.error.code} {data.get('code', '')}".strip()
    return f"session: {type(exc).__name__}"


async def run_campaign(
    campaign: Campaign, faults: list[str], sessions: int, seconds: float, settle: float
) -> list[dict]:
    stop = asyncio.Event()
    loads = [asyncio.create_task(campaign.load(name, stop)) for name in campaign.gateways for _ in range(sessions)]
    loads.append(asyncio.create_task(campaign.supervise(stop)))
    reports = []
    try:
        await asyncio.sleep(settle)
        for fault in faults:
            struck = time.monotonic()
            await getattr(campaign, fault)(seconds)
            over = time.monotonic()
            served = {}
            for name in campaign.gateways:
                deadline = over + RECOVERY_BOUND
                while (at := campaign.served_since(name, over)) is None and time.monotonic() < deadline:
                    await asyncio.sleep(0.1)  # polling the load's own record, bounded
                served[name] = round(at - over, 2) if at is not None else None
            await asyncio.sleep(settle)
            report = _report(campaign, fault, struck, over, served)
            report["restarted"] = [f"{what} (exit {status})" for at, what, status in campaign.restarts if at >= struck]
            campaign.restarts.clear()
            reports.append(report)
            print(json.dumps(reports[-1]), file=sys.stderr)
    finally:
        stop.set()
        await asyncio.gather(*loads, return_exceptions=True)
    return reports


def _report(campaign: Campaign, fault: str, struck: float, over: float, served: dict) -> dict:
    during = [
        c
        for c in campaign.calls
        if c.ended >= struck and c.started <= over + max(filter(None, served.values()), default=0)
    ]
    outcomes: dict[str, int] = {}
    for call in during:
        outcomes[call.outcome] = outcomes.get(call.outcome, 0) + 1
    waits = [c.ended - c.started for c in during]
    bar = BARS.get(fault, DEFAULT_BAR)
    return {
        "fault": fault,
        "fault_seconds": round(over - struck, 2),
        "calls": len(during),
        "outcomes": outcomes,
        "longest_wait_s": round(max(waits, default=0), 2),
        "served_again_after_s": served,
        "bar_s": bar,
        "held": all(s is not None and s <= bar for s in served.values()) and max(waits, default=0) <= DEADLINE + MARGIN,
    }


def accounting(mark: int, within: float) -> dict:
    """Wait up to `within` s for every approval since `mark` to have its completion; what was found."""
    from audit.models import AuditEvent

    def counts() -> tuple[set, dict]:
        rows = AuditEvent.objects.filter(id__gt=mark, kind__in=("approved", "completed"))
        approved = set(rows.filter(kind="approved").values_list("request_id", flat=True))
        completed = dict(rows.filter(kind="completed").values_list("request_id", "outcome"))
        return approved - set(completed), completed

    started = time.monotonic()
    while (open_ := counts()[0]) and time.monotonic() - started < within:
        time.sleep(0.5)  # polling the trail for the sweep's rows, bounded by `within`
    open_, completed = counts()
    by_outcome: dict[str, int] = {}
    for outcome in completed.values():
        by_outcome[outcome] = by_outcome.get(outcome, 0) + 1
    return {
        "approved": len(completed) + len(open_),
        "completed": by_outcome,
        "open": len(open_),
        "settled_within_s": round(time.monotonic() - started, 1),
    }


def setup(database_url: str) -> str:
    """A migrated database with the demo upstream and an agent without limits; returns its key."""
    import django

    os.environ["DATABASE_URL"] = database_url
    django.setup()
    from django.core.management import call_command

    from policy.models import Agent
    from policy.services import agent_create
    from registry.models import Upstream
    from registry.services import upstream_catalog_sync, upstream_save

    call_command("migrate", verbosity=0)
    teardown()
    demo = [sys.executable, str(ROOT / "examples/demo_upstream.py")]
    upstream = Upstream(slug=SLUG, transport="stdio", command=demo[0], args=demo[1:], timeout=TIMEOUT)
    upstream.calls_per_minute = upstream.max_concurrent = 10**9
    upstream_save(upstream=upstream, created=True)
    assert upstream_catalog_sync(upstream=upstream).ok
    issued = agent_create(name="faults")
    Agent.objects.filter(pk=issued.agent.pk).update(calls_per_minute=10**9, max_calls_per_session=10**9)
    return issued.key


def teardown() -> None:
    from policy.models import Agent
    from registry.models import Upstream

    Agent.objects.filter(name="faults").delete()
    Upstream.objects.filter(slug=SLUG).delete()


def table(reports: list[dict], audit: dict) -> str:
    lines = [
        "| fault | its length s | calls overlapping | outcomes | longest wait s (deadline 10 + 1) "
        "| served again after s (inline, celery) | restarted by the supervisor | bar s | held |",
        "|---|---:|---:|---|---:|---|---|---:|---|",
    ]
    for r in reports:
        outcomes = ", ".join(f"{k}: {v}" for k, v in sorted(r["outcomes"].items(), key=lambda kv: -kv[1]))
        served = ", ".join("none" if s is None else f"{s:.2f}" for s in r["served_again_after_s"].values())
        lines.append(
            f"| {r['fault']} | {r['fault_seconds']:.1f} | {r['calls']} | {outcomes} | {r['longest_wait_s']:.2f} "
            f"| {served} | {', '.join(r['restarted']) or 'nothing'} | {r['bar_s']:.0f} "
            f"| {'yes' if r['held'] else '**no**'} |"
        )
    lines.append("")
    lines.append(
        f"Audit: {audit['approved']} approvals, completions by outcome {audit['completed']}, "
        f"{audit['open']} left open after {audit['settled_within_s']} s."
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--faults", default=",".join(FAULTS))
    parser.add_argument("--sessions", type=int, default=4, help="client sessions per gateway")
    parser.add_argument("--seconds", type=float, default=3.0, help="how long each fault lasts")
    parser.add_argument("--settle", type=float, default=3.0, help="load before and after each fault")
    parser.add_argument("--account", type=float, default=60.0, help="how long every approval may take to settle")
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/faults.json")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # stopped from outside: the processes it started end too
    faults = args.faults.split(",")
    if unknown := set(faults) - set(FAULTS):
        parser.error(f"unknown faults: {', '.join(sorted(unknown))}; known: {', '.join(FAULTS)}")
    logs = args.out.parent
    logs.mkdir(parents=True, exist_ok=True)
    database = urlsplit(os.environ["DATABASE_URL"])
    proxy = servers.TcpProxy((database.hostname or "127.0.0.1", database.port or 5432))
    redis_port = servers.free_port()
    env = (
        dict(os.environ)
        | SWEEP
        | {
            "DATABASE_URL": database._replace(
                netloc=f"{database.username or 'postgres'}@127.0.0.1:{proxy.port}"
            ).geturl(),
            "REDIS_URL": f"redis://127.0.0.1:{redis_port}/0",
            "GATEWAY_CONNECT_TIMEOUT": str(CONNECT),
            "LOG_LEVEL": "INFO",
        }
    )
    os.environ["REDIS_URL"] = env["REDIS_URL"]
    campaign = Campaign(env, logs, redis_port, proxy)  # its Redis first: the setup below publishes to it
    try:
        campaign.key = setup(os.environ["DATABASE_URL"])
        from audit.models import AuditEvent

        mark = AuditEvent.objects.order_by("-id").values_list("id", flat=True).first() or 0
        campaign.start()
        reports = asyncio.run(run_campaign(campaign, faults, args.sessions, args.seconds, args.settle))
        audit = accounting(mark, args.account)  # while the gateways and beat run: their sweeps settle calls
    finally:
        campaign.stop()
        proxy.close()
    teardown()
    waits = [c.ended - c.started for c in campaign.calls]
    summary = {"calls": len(campaign.calls), "p50_wait_s": statistics.median(waits) if waits else None}
    args.out.write_text(
        json.dumps(
            {"faults": reports, "audit": audit, "summary": summary, "calls": [asdict(c) for c in campaign.calls]}
        )
    )
    print(table(reports, audit))
    held = all(r["held"] for r in reports) and audit["open"] == 0
    print("every bar held" if held else "A BAR FAILED")
    sys.exit(0 if held else 1)


if __name__ == "__main__":
    main()
