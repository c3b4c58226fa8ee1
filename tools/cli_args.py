"""Command-line arguments of tools/loadgen.py (run, sweep, overload, single, sporadic); the workload
group is shared with tools/ramp.py."""

from __future__ import annotations

import argparse

from tools.workload import ARRIVALS, PRESETS, TEXT_MODES, Workload


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _floats(text: str) -> list[float]:
    vals = [float(x) for x in text.split(",") if x.strip()]
    if not vals or any(v <= 0 for v in vals):
        raise argparse.ArgumentTypeError("need a comma list of positive rates")
    return vals


def _common(p: argparse.ArgumentParser, *, query_len: int, items: int, item_len: int) -> None:
    p.add_argument("--url", default="http://127.0.0.1:8000", help="service base URL")
    p.add_argument("--out", help="JSON result path (default docs/results/loadgen_<cmd>.json)")
    p.add_argument("--timeout", type=float, default=30.0, help="per-request timeout, s")
    p.add_argument("--seed", type=int, default=0, help="seeds token content and arrivals")
    p.add_argument("--no-progress", action="store_true", help="no tqdm progress bar")
    add_workload_args(p, query_len=query_len, items=items, item_len=item_len)


def add_workload_args(p: argparse.ArgumentParser, *, query_len: int, items: int, item_len: int,
                      vocab: int = 151643) -> None:
    """The request shape (tools/workload.py::Workload); read back by workload_from_args."""
    w = p.add_argument_group("workload (random token ids or text, fresh per request)")
    w.add_argument("--query-len", type=int, default=query_len, help="query tokens")
    w.add_argument("--items", type=int, default=items, help="items per request")
    w.add_argument("--item-len", type=int, default=item_len, help="tokens per item")
    w.add_argument("--labels", type=_ints, default=[9454, 2753], help="label ids, comma list")
    w.add_argument("--vocab", type=int, default=vocab, help="token ids drawn from [0, vocab)")
    w.add_argument("--apply-softmax", action="store_true", help="send apply_softmax: true")
    w.add_argument("--text", choices=TEXT_MODES, help="send strings, not token ids: repeat = "
                   "SGLang bench_score style, natural = seeded English words")
    w.add_argument("--rerank", action="store_true", help="POST /v1/rerank {query, documents} "
                   "(needs --text)")
    w.add_argument("--query-repeats", type=int, default=1, help="send each query this many "
                   "times (fresh items each time)")
    w.add_argument("--repeat-window", type=float, default=1.0, help="...within about this "
                   "many seconds at the offered rate")
    w.add_argument("--model", help="send this `model` (an adapter's name, docs/API.md)")
    w.add_argument("--preset", choices=sorted(PRESETS), help="a named shape (overrides "
                   "--query-len, --items, --item-len, --query-repeats): tools/workload.py")


def workload_from_args(args: argparse.Namespace) -> Workload:
    shape = dict(query_len=args.query_len, items=args.items, item_len=args.item_len,
                 query_repeats=args.query_repeats)
    shape.update(PRESETS.get(args.preset or "", {}))
    return Workload(labels=tuple(args.labels), vocab=args.vocab,
                    apply_softmax=args.apply_softmax, text=args.text, rerank=args.rerank,
                    repeat_window_s=args.repeat_window, model=args.model, **shape)


def _rate_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--duration", type=float, default=30.0, help="measured seconds per rate")
    p.add_argument("--warmup", type=float, default=5.0, help="unmeasured seconds before it")
    p.add_argument("--arrival", choices=ARRIVALS, default="poisson", help="inter-arrival times")
    p.add_argument("--clients", type=int, default=0, help="client processes sharing the rate "
                   "(tools/client_pool.py); 0: one per 100 req/s offered, which a process "
                   "sends on time; a point whose sends fell behind says CLIENT BEHIND")
    p.add_argument("--metrics-url", help="the Ray node's Prometheus URL ('auto': the newest "
                   "local session): each point gets the scorer replicas' balance")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m tools.loadgen",
        description="Open-loop load generator for POST /v1/score or /v1/rerank.")
    sub = parser.add_subparsers(dest="command", required=True)
    big = dict(query_len=120, items=10, item_len=180)

    run = sub.add_parser("run", help="one offered rate")
    _common(run, **big)
    _rate_args(run)
    run.add_argument("--rate", type=float, required=True, help="offered requests/s")

    sweep = sub.add_parser("sweep", help="several rates: best items/s under the P99 bound")
    _common(sweep, **big)
    _rate_args(sweep)
    sweep.add_argument("--rates", type=_floats, help="comma list of req/s (else an auto ramp)")
    sweep.add_argument("--start-rate", type=float, default=1.0, help="ramp: first req/s")
    sweep.add_argument("--factor", type=float, default=2.0, help="ramp: rate multiplier")
    sweep.add_argument("--max-rate", type=float, default=10000.0, help="ramp: stop above this")
    sweep.add_argument("--bisect-steps", type=int, default=3, help="ramp: bisections at the end")
    sweep.add_argument("--p99-ms", type=float, default=500.0, help="P99 latency bound, ms")
    sweep.add_argument("--cooldown", type=float, default=2.0, help="idle seconds between rates")
    sweep.add_argument("--plot", help="PNG path (default: the JSON path with .png)")

    over = sub.add_parser("overload", help="capacity × multiples: goodput, accepted P99 and "
                          "refusal latency past capacity")
    _common(over, **big)
    _rate_args(over)
    over.add_argument("--capacity-rps", type=float, required=True,
                      help="the service's capacity in req/s (e.g. the best point of a sweep)")
    over.add_argument("--multiples", type=_floats, default=[1.0, 1.2, 1.5, 3.0],
                      help="comma list of multiples of the capacity to offer (1 first)")
    over.add_argument("--cooldown", type=float, default=2.0, help="idle seconds between rates")

    single = sub.add_parser("single", help="sequential requests on an idle service")
    _common(single, query_len=0, items=10, item_len=300)
    single.add_argument("--requests", type=int, default=200, help="measured requests")
    single.add_argument("--warmup-requests", type=int, default=5, help="unmeasured, sent first")

    sporadic = sub.add_parser("sporadic", help="a lone request on an idle service: a constant "
                              "low rate, each request's idle time before it recorded")
    _common(sporadic, query_len=120, items=1, item_len=180)
    sporadic.add_argument("--rate", type=float, default=2.0, help="requests/s (constant)")
    sporadic.add_argument("--requests", type=int, default=60, help="measured requests")
    sporadic.add_argument("--warmup-requests", type=int, default=3,
                          help="unmeasured, sent first")
    return parser
