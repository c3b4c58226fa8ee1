"""PNG of a sweep: P99 latency (log scale) against offered items/s, with the P99 bound."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

from loadtest.stats import passes


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


def plot_from_json(sweep_json: str | Path) -> Path:
    """Draw the PNG named in a sweep JSON written by loadtest/loadgen.py."""
    out = json.loads(Path(sweep_json).read_text())
    w, c = out["workload"], out["config"]
    title = (f"{out['meta']['model']}: query {w['query_len']} + {w['items']} items × "
             f"{w['item_len']} tokens, {c['arrival']} arrivals, {c['duration_s']:g} s/point")
    return plot_sweep(out["points"], out["p99_bound_ms"], out["plot"], best=out["best"],
                      title=title)


if __name__ == "__main__":
    print(plot_from_json(sys.argv[1]))
