"""A Serve config for a multi-node Ray cluster, from one of configs/*.yaml (README, "Deploy on a
Ray cluster"):

    python -m ranker_app.cluster_config configs/score.yaml --host 0.0.0.0 --port 8000 \\
        --scorer-resource scorer > my-score.yaml

`--host`/`--port`: where the HTTP proxy listens (the shipped configs listen on 127.0.0.1, which
no other machine reaches). `--scorer-resource NAME`: the scorer replicas ask for one unit of the
custom resource NAME and no CPU, so they run only on nodes started with
`--resources='{"NAME": 1}'` (on GPU nodes `num_gpus: 1` already places them). The rest of the file
is kept as it is.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

SCORER = "ScoreWorker"


def cluster_config(config: dict, host: str, port: int, scorer_resource: str | None) -> dict:
    config = {**config, "http_options": {**config.get("http_options", {}), "host": host,
                                         "port": port}}
    if scorer_resource:
        for app in config["applications"]:
            for deployment in app.get("deployments", []):
                if deployment["name"] == SCORER:
                    options = deployment.setdefault("ray_actor_options", {})
                    options["num_cpus"] = 0
                    options["resources"] = {**options.get("resources", {}), scorer_resource: 1}
    return config


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m ranker_app.cluster_config",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("config", type=Path, help="e.g. configs/score.yaml")
    parser.add_argument("--host", default="0.0.0.0", help="HTTP proxy address (default: all)")
    parser.add_argument("--port", type=int, default=8000, help="HTTP proxy port")
    parser.add_argument("--scorer-resource", help="custom resource the scorer replicas need")
    args = parser.parse_args(argv)
    config = yaml.safe_load(args.config.read_text())
    yaml.safe_dump(cluster_config(config, args.host, args.port, args.scorer_resource),
                   sys.stdout, sort_keys=False)


if __name__ == "__main__":
    main()
