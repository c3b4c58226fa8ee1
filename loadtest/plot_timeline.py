"""PNG of a ramp's timeline: offered/served rate, scorer replicas, queued tokens, P99.

Usage: python -m loadtest.plot_timeline docs/results/ramp.json [out.png]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


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


if __name__ == "__main__":
    src = Path(sys.argv[1])
    out = Path(sys.argv[2]) if len(sys.argv) > 2 else src.with_suffix(".png")
    print(plot_timeline(json.loads(src.read_text()), out))
