"""The batch job: read → Prepare (CPU actors) → Score (one actor per scorer) → write, streamed
by Ray Data block by block (ranker_batch/stages.py).

`score_dataset` is the Python interface (a Dataset in, a Dataset out); `run` reads Parquet or
JSON lines and writes Parquet, as the CLI (ranker_batch/__main__.py) does.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import ray
import ray.data
from ray.data import ActorPoolStrategy

from ranker_batch.rows import KINDS
from ranker_batch.stages import Prepare, Score
from ranker_contract.config import AppConfig

logger = logging.getLogger(__name__)

# Logical CPUs each actor reserves. On a GPU the scorer holds a core for its loop; on CPU (a
# development machine of a few cores) both stages leave room for Ray Data's read and write
# tasks (one CPU each), which would otherwise wait forever behind them.
ACTOR_CPUS = {"cuda": 1.0, "cpu": 0.5}
# Rows per block handed to a stage call. A Score call keeps all of its rows in flight, and an
# actor runs up to SCORE_CALLS_PER_ACTOR calls at once, so the scheduling loop always has rows
# to pack into full batches.
BATCH_ROWS = 64
SCORE_CALLS_PER_ACTOR = 4
# Most tokenizing actors per scorer (Ray Data starts them as the queue needs): one keeps a GPU
# fed on token ids, text needs more. On CPU one, for the reason above.
PREPARERS_PER_SCORER = {"cuda": 4, "cpu": 1}
# Output rows per Parquet file: blocks are small (BATCH_ROWS), and a file per block would leave
# a large job with millions of files.
FILE_ROWS = 1024


def score_dataset(ds: ray.data.Dataset, config: AppConfig, kind: str, *, id_column: str = "id",
                  scorers: int | None = None, preparers: int | None = None,
                  scorer_resource: str | None = None, score_stage: type = Score
                  ) -> ray.data.Dataset:
    """`ds` with one row per API request of `kind` (ranker_batch/rows.py) → one output row per
    input row: `id_column`, the scores, `prompt_tokens` and `error`. `scorers`: scoring actors,
    one per GPU (default: every GPU of the cluster; 1 on CPU). `scorer_resource`: a custom
    resource each scoring actor needs one of (and then no CPU), as the nodes meant for scoring
    offer it (`ray start --resources='{"NAME": 1}'`). `preparers`: most tokenizing actors
    (default PREPARERS_PER_SCORER per scorer). `score_stage`: the scoring stage's class (a
    measurement of the pipeline alone gives a stand-in)."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, not {kind!r}")
    on_gpu = config.engine.device == "cuda"
    scorers = scorers or default_scorers(config)
    preparers = preparers or PREPARERS_PER_SCORER[config.engine.device] * scorers
    args = {"config": config.model_dump(), "kind": kind, "id_column": id_column}
    cpus = ACTOR_CPUS[config.engine.device]
    prepared = ds.map_batches(Prepare, fn_constructor_kwargs=args, batch_size=BATCH_ROWS,
                              batch_format="pyarrow", num_cpus=cpus,
                              compute=ActorPoolStrategy(min_size=1, max_size=preparers))
    placement = ({"num_cpus": 0, "resources": {scorer_resource: 1}} if scorer_resource
                 else {"num_cpus": cpus})
    return prepared.map_batches(
        score_stage, fn_constructor_kwargs=args, batch_size=BATCH_ROWS, batch_format="pyarrow",
        num_gpus=1 if on_gpu else 0, **placement,
        compute=ActorPoolStrategy(size=scorers,
                                  max_concurrent_calls_per_actor=SCORE_CALLS_PER_ACTOR))


def default_scorers(config: AppConfig) -> int:
    """One scoring actor per GPU of the cluster; one on CPU."""
    if config.engine.device != "cuda":
        return 1
    return max(1, int(ray.cluster_resources().get("GPU", 0)))


def read_input(paths: list[str]) -> ray.data.Dataset:
    """Parquet files or folders, or JSON lines (*.jsonl, *.json); local paths or URIs."""
    if all(str(p).endswith((".jsonl", ".json", ".jsonl.gz")) for p in paths):
        return ray.data.read_json(paths)
    return ray.data.read_parquet(paths)


@dataclass(frozen=True, slots=True)
class Summary:
    rows: int
    items: int
    error_rows: int
    prompt_tokens: int
    wall_s: float
    scorers: int

    @property
    def items_per_s(self) -> float:
        return self.items / self.wall_s if self.wall_s else 0.0


def finished_ids(output: str, id_column: str) -> pa.Array | None:
    """The ids of the rows a stopped run of the job wrote to the local folder `output`, or None
    when it holds none. A file its driver left half-written does not read: it is deleted, and
    its rows are scored again."""
    ids = []
    for path in sorted(Path(output).glob("*.parquet")):
        try:
            ids.append(pq.read_table(path, columns=[id_column]).column(id_column))
        except (pa.ArrowException, OSError):
            logger.warning("deleting %s, left unfinished by the stopped run", path)
            path.unlink()
    return pa.concat_arrays([c.combine_chunks() for c in ids]) if ids else None


def without(ds: ray.data.Dataset, id_column: str, done: pa.Array) -> ray.data.Dataset:
    """`ds` less the rows whose id is in `done`."""
    done_ref = ray.put(done)

    def keep(batch: pa.Table) -> pa.Table:
        return batch.filter(pc.invert(pc.is_in(batch.column(id_column),
                                               value_set=ray.get(done_ref))))

    return ds.map_batches(keep, batch_format="pyarrow")


def run(config: AppConfig, kind: str, inputs: list[str], output: str, *, id_column: str = "id",
        scorers: int | None = None, preparers: int | None = None,
        scorer_resource: str | None = None, resume: bool = False) -> Summary:
    """Score `inputs` into Parquet files under `output`; the summary is read back from them.
    `resume`: `output` (a local folder) holds what a stopped run wrote; only the rows it lacks
    are scored and added."""
    started = time.perf_counter()
    scorers = scorers or default_scorers(config)
    ds = read_input(inputs)
    done = finished_ids(output, id_column) if resume else None
    if done is not None:
        ds = without(ds, id_column, done)
    ds = score_dataset(ds, config, kind, id_column=id_column, scorers=scorers,
                       preparers=preparers, scorer_resource=scorer_resource)
    ds.write_parquet(output, min_rows_per_file=FILE_ROWS)
    wall_s = time.perf_counter() - started
    column = "scores" if kind == "score" else "relevance_scores"
    rows = items = errors = tokens = 0
    for ref in ray.data.read_parquet(output, columns=[column, "prompt_tokens", "error"]
                                     ).to_arrow_refs():
        block = ray.get(ref)
        rows += block.num_rows
        errors += pc.count(block.column("error")).as_py()  # the non-null ones
        items += pc.sum(pc.list_value_length(block.column(column))).as_py() or 0
        tokens += pc.sum(block.column("prompt_tokens")).as_py() or 0
    return Summary(rows, items, errors, tokens, wall_s, scorers)
