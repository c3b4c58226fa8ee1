"""PNGs of the load tools' JSON: a loadgen sweep (P99 latency, log scale, against offered
items/s, with the P99 bound) or a ramp's timeline (offered/served rate, scorer replicas, queued
tokens, P99 per second).

Usage: python -m tools.plot RESULT.json [--out OUT.png]
  a sweep's JSON: its PNG goes where the JSON's "plot" says unless --out is given;
  a ramp's JSON (it has a "timeline"): OUT.png, by default the JSON's path with .png.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

from tools.stats import passes


def plot_sweep(points: Sequence[dict], p99_bound_ms: float, path: str | Path, *,
               best: dict | None = None, title: str = "") -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    path = Path(path)
    pts = sorted((p for p in points if p["latency_ms"]["p99"] is not None),
                 key=lambda p: p["offered_items_per_s"])
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=110)
    if pts:
        ax.plot([p["offered_items_per_s"] for p in pts], [p["latency_ms"]["p99"] for p in pts],
                color="0.6", lw=1, zorder=1)
    for ok, style in ((True, dict(marker="o", color="tab:blue", label="P99 ≤ bound, 0 failures")),
                      (False, dict(marker="x", color="tab:red", label="over bound or failures"))):
        sel = [p for p in pts if passes(p, p99_bound_ms) == ok]
        if sel:
            ax.scatter([p["offered_items_per_s"] for p in sel],
                       [p["latency_ms"]["p99"] for p in sel], zorder=2, **style)
    ax.axhline(p99_bound_ms, color="tab:orange", ls="--", label=f"P99 bound {p99_bound_ms:g} ms")
    if best is not None:
        ax.annotate(f"best: {best['achieved_items_per_s']:.1f} items/s",
                    (best["offered_items_per_s"], best["latency_ms"]["p99"]),
                    textcoords="offset points", xytext=(-6, 6), ha="right", fontsize=8)
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    # label the 2x and 5x minor ticks only (all of them crowd the axis)
    ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}" if f"{v:g}"[0] in "25"
                                               else ""))
    ax.set_xlabel("offered items/s")
    ax.set_ylabel("P99 latency (ms)")
    ax.set_title(title, fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def plot_timeline(result: dict, path: str | Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["timeline"]
    t = [r["t"] for r in rows]
    fig, axes = plt.subplots(4, 1, figsize=(8, 9), dpi=110, sharex=True)
    axes[0].step(t, [r["offered_rps"] for r in rows], where="post", label="offered req/s")
    axes[0].plot(t, [r["ok_completed"] for r in rows], label="answered 200 /s")
    axes[0].plot(t, [r["failed"] for r in rows], color="tab:red", label="failed /s")
    axes[1].step(t, [r.get("target_replicas") for r in rows], where="post",
                 label="target (autoscaler)")
    axes[1].plot(t, [r.get("serving_replicas") for r in rows], "o", ms=3, label="serving")
    axes[2].plot(t, [r.get("queued_tokens") for r in rows], label="queued")
    axes[2].plot(t, [r.get("inflight_tokens") for r in rows], label="in flight")
    axes[3].plot(t, [r["p99_ms"] for r in rows], color="tab:purple", label="P99 (by send time)")
    for ax, ylabel in zip(axes, ("requests/s", "scorer replicas", "tokens", "ms")):
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(loc="upper left", fontsize=8)
    axes[-1].set_xlabel("seconds since start")
    summary = result.get("summary", {})
    fig.suptitle(f"ramp {result.get('url', '')}: {summary.get('requests')} requests, "
                 f"{summary.get('failed')} failed", fontsize=10)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path)
    plt.close(fig)
    return path


def plot_from_json(result_json: str | Path, out: str | Path | None = None) -> Path:
    """Draw the PNG of a sweep JSON of tools/loadgen.py (at its "plot" path unless `out`) or
    of a ramp JSON of tools/ramp.py (at `out`, by default the JSON's path with .png)."""
    result = json.loads(Path(result_json).read_text())
    if "timeline" in result:
        return plot_timeline(result, out or Path(result_json).with_suffix(".png"))
    w, c = result["workload"], result["config"]
    title = (f"{result['meta']['model']}: query {w['query_len']} + {w['items']} items × "
             f"{w['item_len']} tokens, {c['arrival']} arrivals, {c['duration_s']:g} s/point")
    return plot_sweep(result["points"], result["p99_bound_ms"], out or result["plot"],
                      best=result["best"], title=title)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m tools.plot", description=__doc__.split("\n\n")[0])
    p.add_argument("result", type=Path, help="JSON of `tools.loadgen sweep` or `tools.ramp`")
    p.add_argument("--out", type=Path, help="PNG path")
    args = p.parse_args(argv)
    print(plot_from_json(args.result, args.out))


if __name__ == "__main__":
    main()
