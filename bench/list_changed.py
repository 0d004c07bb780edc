"""What telling only the sessions whose list changed costs a web process, against what telling every session
used to cost it (issue 38: `list_changed` reaches exactly the sessions whose visible list changed).

Real snapshots, compiled from PostgreSQL (bench/run's environment): a big upstream of --tools tools (the demo
server's DEMO_MANIFEST, synced over stdio) that every agent sees, and a small one owned by a second team; --agents
agents in the two teams and --sessions sessions among them. The change: the small upstream gains a tool (synced
again, so the snapshot is compiled again). Each round compiles the two snapshots afresh and lists every agent's
tools on the old one (as its sessions did), then, in an order turned from round to round, times

- targeted: `session_views_changed` over every session (`_sessions_told`'s work: the names whose tool changed,
  then each standing's view of those), and the tools/list of each session it wakes answered on the new snapshot
  (each standing's list built once, each first page cut and signed);
- broadcast: what waking every session cost the gateway before: every session's tools/list answered so.

The figures are medians over rounds, and the ratio the median of each round's targeted / broadcast.

    bench/run list_changed [--tools 5000] [--agents 100] [--sessions 10000] [--rounds 7]
"""

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from run import DEMO, setup_database  # noqa: E402  (bench/run.py: the same environment)

BIG, SMALL, TEAM = "big", "small", "ops"


def manifest(count: int, prefix: str) -> Path:
    schema = {"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]}
    tools = [
        {"name": f"{prefix}_{n:05d}", "description": f"Looks up record {n} and returns it.", "inputSchema": schema}
        for n in range(count)
    ]
    folder = Path(tempfile.mkdtemp())
    folder.chmod(0o755)  # the sandbox runs the server as an unprivileged user (as tests/factories.py demo_sandbox)
    path = folder / f"{prefix}.json"
    path.write_text(json.dumps({"tools": tools}))
    return path


def setup(tools: int, agents: int) -> tuple[Path, list[int]]:
    """The two upstreams synced, the agents made (half in each team); the small one's manifest and the agents' ids."""
    setup_database()
    from policy.models import Agent, Team
    from policy.services import agent_create
    from registry.models import Upstream
    from registry.services import upstream_catalog_sync, upstream_save

    Upstream.objects.filter(slug__in=[BIG, SMALL]).delete()
    Agent.objects.filter(name__startswith="listener-").delete()
    ops, _ = Team.objects.get_or_create(slug=TEAM, defaults={"name": "Ops"})
    small = manifest(10, "small")
    for slug, path, team in ((BIG, manifest(tools, "tool"), None), (SMALL, small, ops)):
        upstream = Upstream(slug=slug, transport="stdio", command=DEMO[0], args=DEMO[1:], new_tools="approve")
        upstream.env = {"DEMO_MANIFEST": str(path)}
        upstream.sandbox = {"paths": [str(path.parent)]}
        if team is not None:
            upstream.team = team
        upstream_save(upstream=upstream, created=True)
        assert upstream_catalog_sync(upstream=upstream).ok
    made = [agent_create(name=f"listener-{n}").agent for n in range(agents)]
    Agent.objects.filter(pk__in=[a.pk for a in made[: agents // 2]]).update(team=ops)
    return small, [a.pk for a in made]


def change(small: Path, round_number: int) -> None:
    """The small upstream gains a tool, and is synced again."""
    from registry.models import Upstream
    from registry.services import upstream_catalog_sync

    listed = json.loads(small.read_text())
    listed["tools"].append({**listed["tools"][0], "name": f"added_{round_number}"})
    small.write_text(json.dumps(listed))
    assert upstream_catalog_sync(upstream=Upstream.objects.get(slug=SMALL)).ok


def views(snap, agent_ids: list[int], sessions: int) -> dict:
    from handoff.mcp.session_views import SessionView
    from policy.decisions import who_of

    for agent_id in agent_ids:  # every agent listed its tools on the old snapshot
        snap.visible_for(agent_id)
    return {
        f"{agent_ids[n % len(agent_ids)]}:s{n}": SessionView(who_of(agent_ids[n % len(agent_ids)]), (), snap)
        for n in range(sessions)
    }


def targeted(held: dict, new) -> tuple[float, int, float]:
    """The whole cost in ms, the sessions woken, and the ms of choosing them."""
    from handoff.mcp.session_views import session_views_changed

    started = time.perf_counter()
    woken = asyncio.run(session_views_changed(views=held, snap=new))
    chosen = time.perf_counter()
    answered(new, [held[session] for session in woken])
    return (time.perf_counter() - started) * 1000, len(woken), (chosen - started) * 1000


def broadcast(held: dict, new) -> tuple[float, int, float]:
    started = time.perf_counter()
    answered(new, list(held.values()))
    return (time.perf_counter() - started) * 1000, len(held), 0.0


def answered(snap, woken: list) -> None:
    """What the woken sessions' tools/list costs the gateway: each standing's list built once, each first page cut."""
    from handoff.mcp.paging import list_page

    for view in woken:
        list_page("tools/list", [t for t in snap.visible_for(view.who) if view.may_call(snap, t["name"])], None)


def one_round(number: int, small: Path, agent_ids: list[int], sessions: int) -> dict[str, tuple[float, int, float]]:
    from handoff.snapshot import snapshot_compile

    old = snapshot_compile()
    change(small, number)
    measured = {}
    for name in ("targeted", "broadcast") if number % 2 == 0 else ("broadcast", "targeted"):
        new = snapshot_compile()  # each its own, so neither finds the other's lists already built
        measured[name] = (targeted if name == "targeted" else broadcast)(views(old, agent_ids, sessions), new)
    return measured


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tools", type=int, default=5000)
    parser.add_argument("--agents", type=int, default=100)
    parser.add_argument("--sessions", type=int, default=10000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    small, agent_ids = setup(args.tools, args.agents)
    rounds = []
    for number in range(args.rounds):
        rounds.append(one_round(number, small, agent_ids, args.sessions))
        shown = ", ".join(f"{name} {ms:.1f} ms ({woken} woken)" for name, (ms, woken, _) in rounds[-1].items())
        print(f"round {number + 1}: {shown}", file=sys.stderr)
    ratios = [r["targeted"][0] / r["broadcast"][0] for r in rounds]
    print(f"{args.sessions} sessions of {args.agents} agents, {args.tools + 10} tools; the change: {TEAM}'s upstream")
    print("| telling | sessions woken | ms per change p50 [min–max] | of which choosing | / broadcast |")
    print("|---|---:|---:|---:|---:|")
    for name in ("targeted", "broadcast"):
        times, choosing = [r[name][0] for r in rounds], [r[name][2] for r in rounds]
        ratio = f"{statistics.median(ratios):.2f} [{min(ratios):.2f}–{max(ratios):.2f}]" if name == "targeted" else "1"
        spread = f"{statistics.median(times):.1f} [{min(times):.1f}–{max(times):.1f}]"
        chose = f"{statistics.median(choosing):.1f} [{min(choosing):.1f}–{max(choosing):.1f}]"
        print(f"| {name} | {rounds[-1][name][1]} | {spread} | {chose} | {ratio} |")


if __name__ == "__main__":
    main()
