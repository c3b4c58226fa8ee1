"""Tooling over the service: load generation, benchmarks, observability readers and the helpers
that start the service and make models for tests. Its scripts run as `python -m loadtest.NAME`.

  load           workload, stats, http_client (the open-loop sender), client_pool, cli_args,
                 loadgen, ramp, timing_probe, bench_rerank, plot, plot_timeline
  engine         bench_engine, bench_cpu_engine, engine_latency, profile_engine, replica_start,
                 hf_baseline
  observability  prom (reads a node's metrics), prometheus_server (runs a Prometheus),
                 ray_dashboard (the dashboard behind token authentication); the checks built on
                 them are the CLIs scripts/check_dashboard.py and scripts/screenshot_dashboard.py
  service        configs (the shipped YAML), scale_config and scale_summary (run_scale_gpu.sh),
                 service (`serve run` for tests and checks), random_model (seeded random HF
                 folders; CLI scripts/make_random_model.py)
Layers (tests/cpu/test_config.py): loadtest imports the product packages, never scripts or tests.
"""

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = REPO_ROOT / "docs" / "results"  # committed results live beside the docs citing them
DEFAULT_MODEL = REPO_ROOT / "models" / "smollm2-135m-instruct"  # configs/score.yaml's model_path
