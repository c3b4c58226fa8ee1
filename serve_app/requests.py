"""The request path without HTTP: how a request body becomes a scoring job and how the job's
results become the response body. The ingress (serve_app/ingress.py) runs it around an HTTP
call to a scorer replica; the offline batch job (ranker_batch/) around its own scorer, so a
row scores exactly as the same body sent to the service (docs/ARCHITECTURE.md, "The request
path")."""

from __future__ import annotations

from dataclasses import dataclass

from ranker_contract.calibration import CalibrationMap
from ranker_contract.config import AppConfig, RerankPromptChoice
from ranker_contract.model_config import ModelConfig
from ranker_contract.packing import PackedSequence, ScoreJob, merge_results, prefix_key
from serve_app.protocol import ApiError
from serve_app.rerank import RerankPrompter
from serve_app.routes import RERANK_V1, RERANK_V2, SCORE, RerankRoute, Route, ScoreRoute, Tokenized
from serve_app.scoring import pack
from serve_app.tokenizer import TextTokenizer
from serve_app.validate import read_body


def named_model(body: dict) -> str | None:
    """The body's `model` where it is a name; anything else its route's check refuses (400)."""
    model = body.get("model")
    return model if isinstance(model, str) else None


@dataclass(slots=True)
class Packed:
    """A request ready for a scorer: its sequences and the prefix-affinity key."""

    sequences: list[PackedSequence]
    key: bytes | None
    adapter: int = 0  # the LoRA adapter (its index in model_names); 0: the model itself
    model: str | None = None  # one of `models` (ScoreJob.model)
    cache_owner: str = ""  # ScoreJob.cache_owner

    def job(self, tokens: Tokenized, bulk: bool = False) -> ScoreJob:
        return ScoreJob(self.sequences, tokens.label_ids, self.key, self.adapter, self.model,
                        self.cache_owner, bulk)

    @property
    def tokens(self) -> int:
        return sum(s.num_tokens for s in self.sequences)


class RequestPath:
    """The routes of one served model, as the configuration builds them."""

    def __init__(self, config: AppConfig, multiplexed: bool = False,
                 calibrations: dict[str, CalibrationMap] | None = None) -> None:
        """`multiplexed`: `config` is one of `models` (AppConfig.multiplexed). `calibrations`:
        the maps by name (None: config.calibrations())."""
        model_path = config.resolved_model_path()
        model = ModelConfig.from_folder(model_path)
        tokenizer = TextTokenizer(model_path)
        name = config.served_model_name
        self.model_names = config.model_names  # a request's `model`: index = adapter number
        self.served_names = config.served_names  # every name the service answers to
        if calibrations is None:
            calibrations = config.calibrations()
        # per adapter number, the map of its rerank relevance (None: answered raw)
        self.calibrations = [calibrations.get(n) for n in self.model_names]
        self.multiplexed_name = name if multiplexed else None
        self.max_context = model.max_position_embeddings  # query + one item
        self.limits = config.limits
        # Routing keys only for queries the scorers would cache (None: no cache, no key).
        cache = config.engine.prefix_cache
        self.cacheable = (cache.min_tokens, cache.min_query_share) if cache.enabled else None
        # as the scorer loads it (gpu_worker/model/heads.py)
        if config.rerank.classifier_from_labels:
            model = model.with_label_head()
        self.score = ScoreRoute(self.limits, model.vocab_size, tokenizer, name, model.num_labels)
        # On a causal LM, a label that is not exactly one token fails the start, naming it; a
        # classifier scores with its head and reads no label tokens.

        def rerank_routes(choice: RerankPromptChoice) -> dict[str, RerankRoute]:
            prompt = choice.resolved_prompt()
            prompter = RerankPrompter(prompt, tokenizer, label_tokens=not model.is_classifier
                                      or config.rerank.classifier_from_labels,
                                      window=min(self.max_context, self.limits.max_seq_tokens),
                                      chunk_overlap=config.rerank.chunk_overlap_tokens,
                                      max_query_tokens=config.rerank.max_query_tokens)
            return {version: RerankRoute(prompter, prompt.default_instruction, self.limits,
                                         name, version, model.num_labels)
                    for version in ("1", "2")}

        self.rerank = rerank_routes(config.rerank)
        self.routes: dict[str, Route] = {SCORE: self.score, RERANK_V1: self.rerank["1"],
                                         RERANK_V2: self.rerank["2"]}
        # (adapter, route path) -> the adapter's own rerank route, where it has a prompt
        self._own_routes: dict[tuple[int, str], Route] = {}
        for adapter, settings in enumerate(config.adapters, 1):
            if settings.rerank is not None:
                own = rerank_routes(settings.rerank)
                self._own_routes[(adapter, RERANK_V1)] = own["1"]
                self._own_routes[(adapter, RERANK_V2)] = own["2"]

    def parse(self, route: str, body: dict):
        """The request (`body`: serve_app/validate.py::read_body) on the route its model serves
        `route` (an HTTP path) by: (route, request, adapter)."""
        adapter = self.adapter_of(named_model(body))
        own = self.route_for(route, adapter)
        return own, own.parse(body), adapter

    def route_for(self, route: str, adapter: int) -> Route:
        """The route at HTTP path `route`: an adapter's own rerank route where it has its own
        prompt."""
        return self._own_routes.get((adapter, route), self.routes[route])

    def adapter_of(self, model: str | None) -> int:
        """The adapter a request's `model` names (0: the model itself, also when `model`
        is absent). With adapters or other models configured an unknown name is a 404 naming
        it; with none, any name is the one model, as clients hard-code their provider's model
        names."""
        if model is None or len(self.served_names) == 1:
            return 0
        if model in self.served_names and model not in self.model_names:  # (ServedModels')
            raise ApiError(404, f"model {model!r} is one of `models`, which the service "
                           "loads; an offline job scores model_path's model and its adapters",
                           "model")
        if model not in self.model_names:
            raise ApiError(404, f"model {model!r} is not served here; GET /v1/models lists "
                           "the names", "model")
        return self.model_names.index(model)

    def pack(self, route: Route, tokens: Tokenized, adapter: int = 0,
             cache_owner: str = "") -> Packed:
        """The request's sequences ([] for no items); limits are 4xx naming the item. A
        scorer's prefix cache keeps each adapter's and each tenant's (`cache_owner`,
        ScoreJob's) K/V of a query apart, so the routing key names them too."""
        sequences = pack(tokens.prefix, tokens.items, self.limits, self.max_context,
                         item_first=tokens.item_first, field=route.field)
        key = prefix_key(sequences, *self.cacheable) if self.cacheable else None
        if key is not None and adapter:
            key = f"{key} adapter {adapter}"
        if key is not None and cache_owner:
            key = f"{key} {cache_owner}"
        return Packed(sequences, key, adapter, self.multiplexed_name, cache_owner)

    def respond(self, route: Route, req, tokens: Tokenized, packed: Packed,
                results: list[list[list[float]]]) -> dict:
        """The response body from the scorer's results, per sequence (items × labels)."""
        logprobs = merge_results(packed.sequences, results, len(tokens.items))
        return route.respond(req, tokens, logprobs, packed.tokens,
                             self.calibrations[packed.adapter])


@dataclass(frozen=True, slots=True)
class Parsed:
    """A request checked by the route of the model it names."""

    path: RequestPath  # its model's
    route: Route
    request: object  # what route.parse made of the body
    adapter: int

    @property
    def model(self) -> str:
        return self.path.model_names[self.adapter]


class ServedModels:
    """The request path of every model the service answers to: model_path's, with its adapters,
    and one per model of `models`; a request's `model` picks one."""

    def __init__(self, config: AppConfig) -> None:
        calibrations = config.calibrations()  # read once, checked against every served name
        self.main = RequestPath(config, calibrations=calibrations)
        self.multiplexed = {m.name: RequestPath(config.multiplexed(m.name), multiplexed=True,
                                                calibrations=calibrations)
                            for m in config.models}
        self.names = config.served_names
        self.limits = config.limits

    def parse(self, route: str, body: bytes) -> Parsed:
        """The body of a request to HTTP path `route`; every malformed input is a 4xx naming
        the field, an unknown `model` a 404 naming it."""
        data = read_body(body, self.limits)
        path = self.multiplexed.get(named_model(data) or "", self.main)
        return Parsed(path, *path.parse(route, data))
