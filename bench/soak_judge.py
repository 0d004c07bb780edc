"""The soak's bars (bench/soak.py): judged over the last two thirds of a run, written as a table, plotted."""

import statistics
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

# The bars, over the last two thirds of the run; shorter runs are sampled and plotted but not judged.
RSS_GROWTH_PERCENT = 5.0
RSS_MIB_PER_MINUTE = 0.1
DRIFT_PERCENT = 10.0
# A level is the median of a minute's samples, not one sample: a gateway's descriptors at an instant count the
# connections open at that instant.
LEVEL_SECONDS = 60.0
MIB = 1024 * 1024


@dataclass
class Row:
    label: str
    pid: str
    rss_start_mib: float  # the linear fit at the window's start and end
    rss_end_mib: float
    growth_percent: float
    mib_per_minute: float
    fds_start: float  # the levels of the window's first and last minutes
    fds_end: float
    fds_min: int
    fds_max: int
    fds_ok: bool
    rss_ok: bool


def levels(points: list[tuple[float, float]]) -> tuple[float, float]:
    """The median of the first minute's values and of the last minute's."""
    first, last = points[0][0], points[-1][0]
    start = statistics.median([value for t, value in points if t < first + LEVEL_SECONDS])
    return start, statistics.median([value for t, value in points if t > last - LEVEL_SECONDS])


def drift_holds(start: float, end: float) -> bool:
    return abs(end - start) <= start * DRIFT_PERCENT / 100


def process_judge(label: str, pid: str, points: list[tuple[float, int, int]]) -> Row:
    minutes = np.array([t / 60 for t, _, _ in points])
    rss = np.array([kib / 1024 for _, kib, _ in points])
    slope, intercept = np.polyfit(minutes, rss, 1)
    first, last = intercept + slope * minutes[0], intercept + slope * minutes[-1]
    growth = (last - first) / first * 100
    fds = [(t, float(n)) for t, _, n in points]
    fds_start, fds_end = levels(fds)
    return Row(
        label=label,
        pid=pid,
        rss_start_mib=float(first),
        rss_end_mib=float(last),
        growth_percent=float(growth),
        mib_per_minute=float(slope),
        fds_start=fds_start,
        fds_end=fds_end,
        fds_min=int(min(n for _, n in fds)),
        fds_max=int(max(n for _, n in fds)),
        fds_ok=drift_holds(fds_start, fds_end),
        rss_ok=bool(growth < RSS_GROWTH_PERCENT and slope <= RSS_MIB_PER_MINUTE),
    )


def judge(samples: list[dict], start: float) -> dict:
    """The bars over the samples from `start` (seconds) on, for each process alive through that whole window
    (a Deno sandbox lives for one execution: counted, not judged) and for Redis's used_memory."""
    window = [s for s in samples if s["t"] >= start]
    series: dict[str, list[tuple[float, int, int]]] = {}
    labels: dict[str, str] = {}
    for sample in window:
        for pid, p in sample["processes"].items():
            series.setdefault(pid, []).append((sample["t"], p["rss_kib"], p["fds"]))
            labels[pid] = p["label"]
    lasting = [pid for pid, points in series.items() if len(points) == len(window)]
    rows = [process_judge(labels[pid], pid, series[pid]) for pid in lasting]
    redis_row = redis_judge(window)
    transient = Counter(labels[pid] for pid in series if pid not in lasting)
    ok = all(row.rss_ok and row.fds_ok for row in rows) and (redis_row is None or redis_row["ok"])
    rows_out = [asdict(row) for row in sorted(rows, key=lambda r: r.label)]
    return {"rows": rows_out, "redis": redis_row, "transient": dict(transient), "ok": ok, "from_seconds": start}


def redis_judge(window: list[dict]) -> dict | None:
    """Redis's used_memory over the window, or None in a mode without Redis (the embedded default)."""
    memory = [(s["t"], float(s["redis_used_memory"])) for s in window if s["redis_used_memory"] is not None]
    if not memory:
        return None
    values = [value for _, value in memory]
    start, end = levels(memory)
    return {"start": start, "end": end, "min": min(values), "max": max(values), "ok": drift_holds(start, end)}


def table(verdict: dict) -> str:
    lines = [
        "| process | RSS start MiB | RSS end MiB | growth % | MiB/min | fds start | fds end | fds min–max "
        "| RSS | fds |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for r in verdict["rows"]:
        lines.append(
            f"| {r['label']} | {r['rss_start_mib']:.1f} | {r['rss_end_mib']:.1f} | {r['growth_percent']:+.2f} | "
            f"{r['mib_per_minute']:+.3f} | {r['fds_start']:.0f} | {r['fds_end']:.0f} | {r['fds_min']}–{r['fds_max']} | "
            f"{'holds' if r['rss_ok'] else 'FAILS'} | {'holds' if r['fds_ok'] else 'FAILS'} |"
        )
    if (memory := verdict["redis"]) is None:
        lines.append("\nNo Redis in this mode.")
    else:
        lines.append(
            f"\nRedis used_memory: {memory['start'] / MIB:.2f} MiB in the window's first minute, "
            f"{memory['end'] / MIB:.2f} MiB in its last ({memory['min'] / MIB:.2f}–{memory['max'] / MIB:.2f} MiB over "
            f"it): {'holds' if memory['ok'] else 'FAILS'}"
        )
    if verdict["transient"]:
        lines.append(f"Short-lived processes seen in the window (not judged): {verdict['transient']}")
    return "\n".join(lines)


def plot(samples: list[dict], start: float, path: Path) -> None:
    """RSS and open fds of each process over time, and Redis's used_memory; the judged window shaded."""
    series: dict[str, list[tuple[float, int, int]]] = {}
    for sample in samples:
        for pid, p in sample["processes"].items():
            series.setdefault(f"{p['label']} ({pid})", []).append((sample["t"] / 60, p["rss_kib"], p["fds"]))
    lasting = {name: points for name, points in series.items() if len(points) > 2}  # not each Deno sandbox
    figure = Figure(figsize=(11, 10), layout="constrained")
    rss, fds, memory = figure.subplots(3, 1, sharex=True)
    for name, points in sorted(lasting.items()):
        minutes = [t for t, _, _ in points]
        rss.plot(minutes, [kib / 1024 for _, kib, _ in points], label=name)
        fds.plot(minutes, [n for _, _, n in points], label=name)
    held = [s for s in samples if s["redis_used_memory"] is not None]
    memory.plot([s["t"] / 60 for s in held], [s["redis_used_memory"] / MIB for s in held], color="tab:red")
    for axes, title in ((rss, "RSS (MiB)"), (fds, "open file descriptors"), (memory, "Redis used_memory (MiB)")):
        axes.axvspan(start / 60, samples[-1]["t"] / 60, color="0.93", zorder=0)
        axes.set_ylabel(title)
        axes.grid(alpha=0.3)
    rss.set_title("Soak: every process the soak started (shaded: the judged window)")
    rss.legend(fontsize=7, ncol=2, loc="upper left", bbox_to_anchor=(1.01, 1))
    memory.set_xlabel("minutes")
    figure.savefig(path, dpi=90)
