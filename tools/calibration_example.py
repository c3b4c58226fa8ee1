"""The files of the README's calibration example: two rankers of the default model and labelled
rows for each, so that `python -m ranker_batch.calibrate` has something to fit.

Usage: python -m tools.calibration_example FOLDER

Writes, under FOLDER:
  ranker-a/, ranker-b/   two LoRA adapters of models/smollm2-135m-instruct written by peft with
                         seeded random weights: stand-ins for two fine-tunes, that rank alike
                         but whose raw scores sit on different scales
  labelled.parquet       ROWS_PER_RANKER rows per adapter: a question (`query`), its answer and
                         three other questions' answers (`documents`, shuffled), `labels` 1 for
                         the answer and 0 for the others, `model` naming the adapter
  score.yaml             configs/score.yaml serving both adapters
  score-calibrated.yaml  the same, with `calibration: FOLDER/fit/calibration.json`
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import torch
import yaml

from tools import DEFAULT_MODEL, REPO_ROOT

ROWS_PER_RANKER = 200
DISTRACTORS = 3
FACTS = [
    ("What is the capital of France?", "Paris is the capital of France."),
    ("How many legs does a spider have?", "A spider has eight legs."),
    ("What do bees make?", "Bees make honey from the nectar of flowers."),
    ("Which planet is the largest?", "Jupiter is the largest planet of the solar system."),
    ("What is water made of?", "A water molecule is two hydrogen atoms and one oxygen atom."),
    ("Who wrote Hamlet?", "Hamlet is a tragedy written by William Shakespeare."),
    ("How many days does a leap year have?", "A leap year has 366 days."),
    ("At what temperature does water boil?", "At sea level water boils at 100 degrees Celsius."),
    ("What color is a ripe banana?", "A ripe banana is yellow."),
    ("Which ocean is the largest?", "The Pacific is the largest and deepest ocean."),
    ("What gas do plants take in?", "Plants take in carbon dioxide and give off oxygen."),
    ("How many continents are there?", "There are seven continents."),
    ("What is the longest river in Africa?", "The Nile is the longest river in Africa."),
    ("Who painted the Mona Lisa?", "Leonardo da Vinci painted the Mona Lisa."),
    ("What is the freezing point of water?", "Water freezes at 0 degrees Celsius."),
    ("How many strings does a violin have?", "A violin has four strings."),
    ("What is the hardest natural material?", "Diamond is the hardest natural material."),
    ("Which animal is the largest mammal?", "The blue whale is the largest mammal."),
    ("What language is spoken in Brazil?", "Portuguese is the official language of Brazil."),
    ("How many minutes are in an hour?", "An hour has sixty minutes."),
    ("What is the capital of Japan?", "Tokyo is the capital of Japan."),
    ("What do caterpillars turn into?", "Caterpillars turn into butterflies or moths."),
    ("Which metal is liquid at room temperature?", "Mercury is a liquid metal at room "
     "temperature."),
    ("How many players are on a soccer team?", "A soccer team fields eleven players."),
    ("What is the main ingredient of guacamole?", "Guacamole is made mainly of avocado."),
    ("What organ pumps blood?", "The heart pumps blood through the body."),
    ("Which planet is known as the red planet?", "Mars is called the red planet."),
    ("How many sides does a hexagon have?", "A hexagon has six sides."),
    ("What is the tallest mountain on Earth?", "Mount Everest is the tallest mountain above "
     "sea level."),
    ("Who discovered penicillin?", "Alexander Fleming discovered penicillin in 1928."),
]
ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def write_adapter(folder: Path, seed: int, alpha: int) -> None:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(DEFAULT_MODEL),
                           LoraConfig(init_lora_weights=False, r=8, lora_alpha=alpha,
                                      target_modules=ALL))
    model.save_pretrained(folder)


def labelled_rows(names: list[str], seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for name in names:
        for _ in range(ROWS_PER_RANKER):
            k = rng.randrange(len(FACTS))
            others = rng.sample([j for j in range(len(FACTS)) if j != k], DISTRACTORS)
            docs = [(FACTS[k][1], 1.0)] + [(FACTS[j][1], 0.0) for j in others]
            rng.shuffle(docs)
            rows.append({"id": len(rows), "model": name, "query": FACTS[k][0],
                         "documents": [d for d, _ in docs], "labels": [y for _, y in docs]})
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folder", type=Path)
    folder = p.parse_args().folder.resolve()
    folder.mkdir(parents=True, exist_ok=True)
    write_adapter(folder / "ranker-a", seed=4, alpha=2)
    write_adapter(folder / "ranker-b", seed=2, alpha=2)
    pq.write_table(pa.Table.from_pylist(labelled_rows(["ranker-a", "ranker-b"])),
                   folder / "labelled.parquet")
    config = yaml.safe_load((REPO_ROOT / "configs" / "score.yaml").read_text())
    args = config["applications"][0]["args"]
    args["adapters"] = [{"name": name, "path": str(folder / name)}
                        for name in ("ranker-a", "ranker-b")]
    (folder / "score.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    args["calibration"] = str(folder / "fit" / "calibration.json")
    (folder / "score-calibrated.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    print(f"wrote two adapters, {2 * ROWS_PER_RANKER} labelled rows and two configs under "
          f"{folder}")


if __name__ == "__main__":
    main()
