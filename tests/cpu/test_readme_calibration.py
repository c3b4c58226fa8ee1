"""The README's calibration example ("Calibrated scores: one threshold for every ranker"), run as
printed on the CPU default: the example's files, the fit of both adapters, then the two rerank
calls against the served calibrated config. The commands are read from README.md, so the two
cannot drift apart.

What the test changes, and only that: the folder `calibration-example` becomes a temporary one,
`serve run` becomes tools/service.py's start of the same config file (on free ports), and the
calls' `localhost:8000` that service's address. What it checks is what the README says of the
output: the table's two models with ECE and log-loss falling, and on the calls, the answer first
for both rankers, kept by a 0.3 threshold on calibrated scores for both where the raw scores keep
the wrong document too for ranker-b.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys

import pytest
import yaml

from tools import REPO_ROOT
from tools.service import serving

pytestmark = pytest.mark.service  # starts Ray

FOLDER = "calibration-example"
THRESHOLD = 0.3


def readme_blocks() -> list[str]:
    text = (REPO_ROOT / "README.md").read_text()
    section = text[text.index("### Calibrated scores"):]
    section = section[:section.index("\n## ")]
    return re.findall(r"```bash\n(.*?)```", section, re.S)


def _run(command: str, tmp_path) -> str:
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", HF_HUB_OFFLINE="1",
               PATH=f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}")
    run = subprocess.run(["bash", "-c", command.replace(FOLDER, str(tmp_path / FOLDER))],
                         cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return run.stdout


def test_the_readme_calibration_example_runs_as_printed(tmp_path):
    fit, serve, calls = readme_blocks()
    table = _run(fit, tmp_path)
    rows = re.findall(r"^(ranker-[ab]) +(\d+) +([\d.]+) → ([\d.]+) +([\d.]+) → ([\d.]+)$",
                      table, re.M)
    assert [r[0] for r in rows] == ["ranker-a", "ranker-b"], table
    for _, _, ece_raw, ece_cal, loss_raw, loss_cal in rows:
        assert float(ece_cal) < float(ece_raw) and float(loss_cal) < float(loss_raw), table

    config_file = serve.split()[-1].replace(FOLDER, str(tmp_path / FOLDER))
    assert serve.strip().startswith("serve run ")
    with serving(yaml.safe_load(open(config_file))) as service:  # on a free port
        printed = _run(calls.replace("localhost:8000", service.url.removeprefix("http://")),
                       tmp_path)
    lines = [ast.literal_eval(f"[{line.replace(') (', '), (')}]")
             for line in printed.strip().splitlines()]
    assert len(lines) == 2, printed
    for (answer, answer_cal, _), (other, other_cal, _) in lines:
        assert (answer, other) == (0, 1) and answer_cal >= THRESHOLD > other_cal, printed
    (_, _, _), (_, _, b_other_raw) = lines[1]
    assert b_other_raw >= THRESHOLD, printed  # raw: ranker-b keeps the violin too
