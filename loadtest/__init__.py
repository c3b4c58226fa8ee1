"""Benchmarks of the engine and the service, and the GPU harnesses that run them. Each Python
script runs as `python -m loadtest.NAME` (its docstring says how); the shell harnesses
(gpu_checks.sh, run_e2e_gpu.sh, run_scale_gpu.sh; gpu_service.sh is sourced by the last two)
run from the repo root on a GPU machine and state at their top what they need.

  engine   bench_engine (offline GPU throughput, ablations), engine_latency, hf_baseline
  service  bench_prefix (the prefix cache and its routing), scale_config and scale_summary
           (run_scale_gpu.sh)
The load generator, the fidelity tool and the other user-facing tools are in tools/.
Layers (tests/cpu/test_config.py): loadtest imports the product packages and tools, never tests.
"""
