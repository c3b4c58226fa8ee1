"""How much FP8 changes a model's rankings: the same rerank requests scored in fp32 (the
reference), bf16 and each FP8 setting (gpu_worker/model/fp8.py).

Usage: python -m tools.fidelity [--model models/smollm2-135m-instruct] [--requests 200]
       [--items 10] [--settings all,no_down,no_o,qkv_gate_up,edges2] [--device cpu|cuda]
       [--data my_set.jsonl] [--template yes_no] [--out docs/results/fp8_h100/fidelity.json]

Each request is rendered with the rerank template (configs' `rerank`, serve_app/rerank.py) and
packed as the ingress packs it; an item's score is P(yes) / (P(yes) + P(no)) at its last
token. The requests are the labelled pydoc set (tools/fidelity_set.py) or --data, a JSON
lines file of {"query": str, "documents": [str], "relevant": [indices]} ("relevant" may be
left out: no MRR or NDCG then).

Per setting, against bf16 (bf16's own row against fp32, the baseline noise): |Δ| of the label
log-probs (p50/p99/max over items and labels), Kendall τ-b of the item scores per request,
top-1 agreement; and MRR and NDCG@10 (binary relevance) of the setting itself. A setting name
is `all`, `no_down`, `no_o` or `qkv_gate_up` (which linears run in FP8) and/or `edgesN` (the
first and last N decoder layers stay bf16), joined with `+`: `no_o+edges2`.

On CPU the FP8 linears are simulated (the same e4m3 values, an fp32 matmul); --device cuda
runs the served engine (flashinfer, CUDA ops, real FP8 GEMMs; needs compute capability 8.9+).
The `recommended` setting is the FP8 one of highest MRR if that reaches MIN_MRR_RATIO of
bf16's MRR; else none is. Prints a table; writes a JSON list, one object per setting.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from gpu_worker.forward.engine import Engine
from gpu_worker.model.fp8 import quantize_model
from gpu_worker.model.loader import load_model
from ranker_contract.config import FP8_LINEARS, EngineConfig, Fp8Config, Limits, RerankConfig
from ranker_contract.model_config import ModelConfig
from ranker_contract.packing import PackedSequence, merge_results, pack_request
from serve_app.rerank import RerankInput, RerankPrompter, relevance
from serve_app.scoring import DELIMITER_ID
from serve_app.tokenizer import TextTokenizer
from tools import DEFAULT_MODEL, RESULTS_DIR
from tools.fidelity_set import LabelledRequest, labelled_requests
from tools.stats import percentile

MIN_MRR_RATIO = 0.99
# bf16's MRR must beat a random order's by this much (about 2 standard errors at 100 requests)
# for MRR to tell settings apart; below it the recommendation rests on chance.
MIN_MRR_OVER_RANDOM = 0.05
SETTING_LINEARS = {
    "all": FP8_LINEARS,
    "no_down": ("qkv_proj", "o_proj", "gate_up_proj"),
    "no_o": ("qkv_proj", "gate_up_proj", "down_proj"),
    "qkv_gate_up": ("qkv_proj", "gate_up_proj"),
}
DEFAULT_SETTINGS = "all,no_down,no_o,qkv_gate_up,edges2"
DEFAULT_OUT = RESULTS_DIR / "fp8_h100" / "fidelity.json"


@dataclass(frozen=True, slots=True)
class Packed:
    """One request as the engine takes it."""

    sequences: list[PackedSequence]
    num_items: int


# ---- metrics (pure functions; scores are per item, higher is more relevant) ----

def ranking(scores: list[float]) -> list[int]:
    """Item indices best first; ties keep index order (as /v1/rerank sorts)."""
    return sorted(range(len(scores)), key=lambda i: (-scores[i], i))


def reciprocal_rank(scores: list[float], relevant: list[int]) -> float:
    """1 / the rank (from 1) of the best-ranked relevant item; 0.0 when none is relevant."""
    wanted = set(relevant)
    return next((1.0 / r for r, i in enumerate(ranking(scores), 1) if i in wanted), 0.0)


def ndcg_at_10(scores: list[float], relevant: list[int]) -> float:
    """Binary-relevance NDCG over the top 10: DCG / the DCG of every relevant item first."""
    wanted = set(relevant)
    dcg = sum(1.0 / math.log2(r + 1) for r, i in enumerate(ranking(scores)[:10], 1) if i in wanted)
    ideal = sum(1.0 / math.log2(r + 1) for r in range(1, min(len(wanted), 10) + 1))
    return dcg / ideal if ideal else 0.0


def kendall_tau(a: list[float], b: list[float]) -> float:
    """Kendall's τ-b of two score lists over the same items (ties counted as in SciPy); two
    lists that tie everything agree (1.0), one that ties everything against one that does not
    is 0.0."""
    concordant = discordant = ties_a = ties_b = 0
    for i in range(len(a)):
        for j in range(i + 1, len(a)):
            sign = (a[i] - a[j]) * (b[i] - b[j])
            concordant += sign > 0
            discordant += sign < 0
            ties_a += a[i] == a[j] and b[i] != b[j]
            ties_b += b[i] == b[j] and a[i] != a[j]
    untied = concordant + discordant
    denominator = math.sqrt((untied + ties_a) * (untied + ties_b))
    if denominator == 0:
        return 1.0 if ties_a == ties_b == 0 else 0.0
    return (concordant - discordant) / denominator


def same_top1(a: list[float], b: list[float]) -> bool:
    return ranking(a)[0] == ranking(b)[0]


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def compare(logprobs: list[list[list[float]]], reference: list[list[list[float]]]) -> dict:
    """A precision's label log-probs (per request: items × labels) against the reference's."""
    diffs = [abs(x - y) for req, ref in zip(logprobs, reference)
             for row, ref_row in zip(req, ref) for x, y in zip(row, ref_row)]
    scores = [[relevance(row) for row in req] for req in logprobs]
    ref_scores = [[relevance(row) for row in req] for req in reference]
    return {
        "top1_agreement": _mean([float(same_top1(s, r)) for s, r in zip(scores, ref_scores)]),
        "kendall_tau_mean": _mean([kendall_tau(s, r) for s, r in zip(scores, ref_scores)]),
        "logprob_abs_diff_p50": percentile(diffs, 50),
        "logprob_abs_diff_p99": percentile(diffs, 99),
        "logprob_abs_diff_max": max(diffs),
    }


def random_mrr(n: int, k: int) -> float:
    """The expected reciprocal rank of a random order of n items, k of them relevant: the best
    relevant item sits at rank r with probability C(n-r, k-1) / C(n, k)."""
    return sum(math.comb(n - r, k - 1) / (r * math.comb(n, k)) for r in range(1, n - k + 2))


def random_ndcg_at_10(n: int, k: int) -> float:
    """The expected NDCG@10 of a random order: each rank holds a relevant item with p = k/n."""
    ideal = sum(1.0 / math.log2(r + 1) for r in range(1, min(k, 10) + 1))
    return k / n * sum(1.0 / math.log2(r + 1) for r in range(1, min(n, 10) + 1)) / ideal


def chance(requests: list[LabelledRequest]) -> dict:
    """What a random ranking scores on the labelled requests: the floor MRR must clear."""
    sizes = [(len(r.documents), len(r.relevant)) for r in requests if r.relevant]
    return {"mrr_random": _mean([random_mrr(n, k) for n, k in sizes]),
            "ndcg10_random": _mean([random_ndcg_at_10(n, k) for n, k in sizes])}


def quality(logprobs: list[list[list[float]]], requests: list[LabelledRequest]) -> dict:
    """MRR and NDCG@10 over the requests that have a relevant item (None if none has)."""
    pairs = [([relevance(row) for row in req], r.relevant)
             for req, r in zip(logprobs, requests) if r.relevant]
    return {"mrr": _mean([reciprocal_rank(s, rel) for s, rel in pairs]),
            "ndcg10": _mean([ndcg_at_10(s, rel) for s, rel in pairs])}


# ---- requests, engines, scoring ----

def parse_setting(name: str) -> Fp8Config:
    """`all`, `no_down`, `no_o`, `qkv_gate_up`, `edgesN`, or a `+` of one of each: the
    engine.fp8 section that serves it."""
    linears, edges = FP8_LINEARS, 0
    for part in name.split("+"):
        if part in SETTING_LINEARS:
            linears = SETTING_LINEARS[part]
        elif match := re.fullmatch(r"edges(\d+)", part):
            edges = int(match[1])
        else:
            raise ValueError(f"unknown FP8 setting part {part!r} in {name!r}: use "
                             f"{', '.join(SETTING_LINEARS)} or edgesN")
    return Fp8Config(linears=linears, bf16_first_layers=edges, bf16_last_layers=edges)


def read_jsonl(path: Path) -> list[LabelledRequest]:
    """--data: one {"query", "documents", "relevant"?} object a line."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [LabelledRequest(r["query"], r["documents"], r.get("relevant", []), "", "")
            for r in rows]


def pack_all(folder: Path, template: str, requests: list[LabelledRequest]
             ) -> tuple[list[int], list[Packed]]:
    """The rerank template's (yes, no) label ids, and each request packed as the ingress
    packs /v1/rerank."""
    prompt = RerankConfig(template=template).resolved_prompt()
    prompter = RerankPrompter(prompt, TextTokenizer(folder))
    max_context = ModelConfig.from_folder(folder).max_position_embeddings
    packed = []
    for r in requests:
        rerank = RerankInput(r.query, r.documents, prompt.default_instruction, None, False, None,
                             None)
        tokens = prompter.tokenize(rerank)
        query_ids, item_ids = tokens.prefix, tokens.items
        sequences = pack_request(query_ids, item_ids, item_first=False, delimiter_id=DELIMITER_ID,
                                 max_seq_tokens=Limits().max_seq_tokens, max_context=max_context)
        packed.append(Packed(sequences, len(item_ids)))
    return prompter.label_ids, packed


def build_engine(folder: Path, precision: str, device: str) -> Engine:
    """`fp32`, `bf16` or an FP8 setting name, on the CPU (FP8 simulated) or the GPU. An FP8
    checkpoint runs its stored e4m3 linears in the FP8 settings and is dequantized in the
    others (docs/OPERATIONS.md, "FP8 checkpoints"). fp32 runs HF's order of operations
    (the engine's reference kernels), on either device."""
    setting = None if precision in ("fp32", "bf16") else parse_setting(precision)
    if device == "cuda" and precision != "fp32":
        fp8 = Fp8Config(dequantize_checkpoint=True) if setting is None else setting
        return Engine.from_config(folder, EngineConfig(
            device="cuda", precision="fp8" if setting else "bf16", fp8=fp8))
    dtype = torch.float32 if precision == "fp32" else torch.bfloat16
    model = load_model(folder, dtype, torch.device(device), "fp8" if setting else "bf16",
                       dequantize_fp8=setting is None)
    if setting is not None:  # off CUDA: the FP8 GEMMs simulated in fp32 (gpu_worker/model/fp8.py)
        quantize_model(model, setting)
    return Engine(model, torch.device(device), reference=True)


def score_all(engine: Engine, label_ids: list[int], packed: list[Packed],
              bar: tqdm) -> list[list[list[float]]]:
    """Per request: items × (yes, no) log-probs, one request per forward."""
    out = []
    for p in packed:
        results = engine.finish(engine.launch(p.sequences, [label_ids] * len(p.sequences)))
        out.append(merge_results(p.sequences, results, p.num_items))
        bar.update(1)
    return out


# ---- the report ----

def report_rows(args: argparse.Namespace, requests: list[LabelledRequest],
                logprobs: dict[str, list[list[list[float]]]]) -> list[dict]:
    """One object per precision but fp32: bf16 against fp32, each FP8 setting against bf16."""
    fp32, bf16 = quality(logprobs["fp32"], requests), quality(logprobs["bf16"], requests)
    common = {"requests": len(requests),
              "items_per_request": _mean([len(r.documents) for r in requests]),
              "mrr_bf16": bf16["mrr"], "ndcg10_bf16": bf16["ndcg10"], "mrr_fp32": fp32["mrr"],
              "ndcg10_fp32": fp32["ndcg10"], **chance(requests),
              "engine_items_per_s_0_6b": None}
    rows = []
    for name, lps in logprobs.items():
        if name == "fp32":
            continue
        setting = parse_setting(name) if name != "bf16" else None
        reference = "fp32" if setting is None else "bf16"
        rows.append({"model": Path(args.model).name, "setting": name, **common,
                     "compared_with": reference,
                     "fp8_linears": list(setting.linears) if setting else [],
                     "fp8_bf16_first_layers": setting.bf16_first_layers if setting else None,
                     "fp8_bf16_last_layers": setting.bf16_last_layers if setting else None,
                     **compare(lps, logprobs[reference]), **quality(lps, requests),
                     "recommended": False, **run_facts(args)})
    return recommend(rows)


def mrr_informative(row: dict) -> bool:
    """Whether bf16 ranks the labelled set better than chance (else MRR cannot judge FP8)."""
    return row["mrr_bf16"] >= row["mrr_random"] + MIN_MRR_OVER_RANDOM


def recommend(rows: list[dict]) -> list[dict]:
    """Mark the FP8 setting of highest MRR if it keeps MIN_MRR_RATIO of bf16's MRR, where bf16
    itself ranks better than chance."""
    fp8 = [r for r in rows if r["fp8_linears"] and r["mrr"] is not None]
    if fp8:
        best = max(fp8, key=lambda r: r["mrr"])
        best["recommended"] = (mrr_informative(best)
                               and best["mrr"] >= MIN_MRR_RATIO * best["mrr_bf16"])
    return rows


def run_facts(args: argparse.Namespace) -> dict:
    if args.device == "cuda":
        device = f"cuda: {torch.cuda.get_device_name()} (real FP8 GEMMs)"
    else:
        device = f"cpu: {os.cpu_count()} cores (FP8 simulated: e4m3 values, fp32 matmul)"
    data = str(args.data) if args.data else f"pydoc topics, seed {args.seed}, items {args.items}"
    return {"command": "python -m tools.fidelity " + " ".join(sys.argv[1:]), "device": device,
            "date": datetime.date.today().isoformat(), "data": data,
            "python": sys.version.split()[0], "torch": torch.__version__}


def print_table(rows: list[dict]) -> None:
    def f(x: float | None, digits: int = 3) -> str:
        return "-" if x is None else f"{x:.{digits}f}"

    print(f"{'setting':<18}{'vs':>5}{'reqs':>6}{'top-1':>7}{'tau':>7}{'|d| p99':>9}"
          f"{'MRR':>7}{'bf16':>7}{'NDCG10':>8}{'bf16':>7}  rec")
    for r in rows:
        print(f"{r['setting']:<18}{r['compared_with']:>5}{r['requests']:>6}"
              f"{f(r['top1_agreement']):>7}{f(r['kendall_tau_mean']):>7}"
              f"{f(r['logprob_abs_diff_p99'], 4):>9}{f(r['mrr']):>7}{f(r['mrr_bf16']):>7}"
              f"{f(r['ndcg10']):>8}{f(r['ndcg10_bf16']):>7}  {'yes' if r['recommended'] else ''}")
    best = [r["setting"] for r in rows if r["recommended"]]
    print(f"a random order: MRR {f(rows[0]['mrr_random'])}, NDCG@10 {f(rows[0]['ndcg10_random'])}")
    if best:
        print(f"recommended: {best[0]}")
    elif rows[0]["mrr"] is not None and not mrr_informative(rows[0]):
        print("recommended: none (bf16's MRR is not clearly above a random order's: MRR cannot "
              "judge FP8 on this model and set; compare tau and top-1)")
    else:
        print(f"recommended: none (no FP8 setting keeps {MIN_MRR_RATIO:.0%} of bf16's MRR)")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m tools.fidelity",
                                description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, default=DEFAULT_MODEL, help="HF model folder")
    p.add_argument("--requests", type=int, default=200, help="the first N requests of the set")
    p.add_argument("--items", type=int, default=10, help="documents per pydoc request "
                   "(0: 10-50, seeded)")
    p.add_argument("--settings", default=DEFAULT_SETTINGS, help="FP8 settings, comma list")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--data", type=Path, help="JSON lines {query, documents, relevant} "
                   "instead of the pydoc set")
    p.add_argument("--template", choices=("yes_no", "qwen3"), default="yes_no",
                   help="the rerank prompt (ranker_contract/config.py)")
    p.add_argument("--seed", type=int, default=0, help="the pydoc set's seed")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON result path")
    p.add_argument("--no-progress", action="store_true", help="no tqdm progress bar")
    args = p.parse_args(argv)
    try:
        for name in args.settings.split(","):
            parse_setting(name)  # fail before any model loads
    except ValueError as exc:
        p.error(f"--settings: {exc}")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.device == "cpu":
        torch.set_num_threads(os.cpu_count() or 1)
    requests = (read_jsonl(args.data)[:args.requests] if args.data else
                labelled_requests(args.requests, args.items or None, args.seed))
    label_ids, packed = pack_all(args.model, args.template, requests)
    precisions = ["fp32", "bf16", *args.settings.split(",")]
    logprobs = {}
    with tqdm(total=len(precisions) * len(packed), desc="fidelity", unit="req",
              disable=args.no_progress) as bar:
        for precision in precisions:
            bar.set_postfix_str(precision)
            engine = build_engine(args.model, precision, args.device)
            logprobs[precision] = score_all(engine, label_ids, packed, bar)
            del engine
    rows = report_rows(args, requests, logprobs)
    print_table(rows)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
