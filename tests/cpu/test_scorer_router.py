"""Routing to the scorer replicas (ranker_app/scorer_router.py) without a cluster: Serve's own
RequestRouter base class, fed replicas and pending jobs the way Serve's router does
(choose_replicas, then on_request_routed once sent, on_request_completed once answered)."""

from __future__ import annotations

import asyncio
import itertools
import random
from collections import Counter
from types import SimpleNamespace

from ray.serve._private.common import DeploymentHandleSource, DeploymentID, ReplicaID

from ranker_app.scorer_router import ScorerRouter
from ranker_contract.packing import ScoreJob, pack_plain

DEPLOYMENT = DeploymentID(name="ScoreWorker", app_name="score")
_ids = itertools.count()


def replicas(*names: str, models: dict[str, set[str]] | None = None) -> list[SimpleNamespace]:
    """`models`: replica name -> the models of `models` it tells Serve it holds."""
    return [SimpleNamespace(replica_id=ReplicaID(unique_id=n, deployment_id=DEPLOYMENT),
                            multiplexed_model_ids=(models or {}).get(n, set()))
            for n in names]


def pending(key: str | None, tokens: int = 100, adapter: int = 0,
            model: str | None = None) -> SimpleNamespace:
    job = ScoreJob([pack_plain(list(range(tokens)), 0)], [1], key, adapter, model)
    return SimpleNamespace(args=[job], routing_context=SimpleNamespace(should_backoff=False),
                           metadata=SimpleNamespace(internal_request_id=f"r{next(_ids)}"))


def new_router() -> ScorerRouter:
    return ScorerRouter(DEPLOYMENT, DeploymentHandleSource.UNKNOWN)


def choose(router, candidates, request):
    return asyncio.run(router.choose_replicas(candidates, request))


def first_choice(router, candidates, key, tokens: int = 100) -> str:
    return choose(router, candidates, pending(key, tokens))[0][0].replica_id.unique_id


def send(router, candidates, request) -> ReplicaID:
    """Route `request` as Serve does when the first choice accepts it."""
    chosen = choose(router, candidates, request)[0][0].replica_id
    router.on_request_routed(request, chosen, None)
    return chosen


def test_a_key_goes_to_the_same_replica_from_every_router_and_keys_spread():
    candidates = replicas("a", "b", "c", "d")
    owners = {}
    for k in range(400):
        key = f"{k:016x}"
        owners[key] = first_choice(new_router(), candidates, key)
        # Another ingress process, candidates in another order: the same owner.
        assert first_choice(new_router(), candidates[::-1], key) == owners[key]
    shares = Counter(owners.values())
    assert set(shares) == {"a", "b", "c", "d"}
    assert all(60 <= n <= 140 for n in shares.values()), shares  # 100 each on average


def test_every_replica_is_a_fallback():
    router = new_router()
    for key in ("00ff", None):
        tiers = choose(router, replicas("a", "b", "c"), pending(key))
        assert [len(t) for t in tiers] == [1, 1, 1]
        assert {t[0].replica_id.unique_id for t in tiers} == {"a", "b", "c"}


def test_a_hot_key_spills_past_its_share_and_comes_back_when_load_drops():
    router = new_router()
    candidates = replicas("a", "b", "c", "d")
    owner = first_choice(new_router(), candidates, "hot")
    sent = Counter()
    requests = []
    for _ in range(40):  # none completes: the owner fills up to its bound, then others take it
        request = pending("hot")
        chosen = send(router, candidates, request)
        requests.append((chosen, request))
        sent[chosen.unique_id] += 1
    mean = 40 / 4
    assert sent[owner] <= max(1.25 * mean, mean + 2) + 1, sent
    assert len(sent) > 1
    for replica, request in requests:  # everything answered: the owner again
        router.on_request_completed(replica, request.metadata.internal_request_id)
    assert router.outstanding() == {}
    assert first_choice(router, candidates, "hot") == owner


def test_a_replica_that_goes_moves_only_its_own_keys():
    router = new_router()
    four, three = replicas("a", "b", "c", "d"), replicas("a", "b", "c")
    keys = [f"k{k}" for k in range(200)]
    before = {key: first_choice(new_router(), four, key) for key in keys}

    async def lose_d():  # Serve calls it on its event loop
        router.update_replicas(three)
    asyncio.run(lose_d())
    after = {key: first_choice(new_router(), three, key) for key in keys}
    for key in keys:
        if before[key] != "d":
            assert after[key] == before[key]
    assert any(before[key] == "d" for key in keys)


def test_jobs_without_a_key_go_to_the_fewest_outstanding_tokens():
    router = new_router()
    a, b = candidates = replicas("a", "b")
    big = pending(None, tokens=9000)
    first = send(router, candidates, big)
    other = b if first == a.replica_id else a
    # Nine small jobs all go to the other replica: together they are still under the big one.
    for _ in range(8):
        assert send(router, candidates, pending(None, tokens=1000)) == other.replica_id
    router.on_request_completed(first, big.metadata.internal_request_id)
    assert send(router, candidates, pending(None, tokens=1000)) == first


def test_a_choice_counts_before_serve_confirms_it():
    """Two jobs chosen back to back (the first not yet confirmed as sent) go to two replicas;
    a choice never confirmed (its request cancelled while waiting) stops counting."""
    router = new_router()
    candidates = replicas("a", "b")
    first = choose(router, candidates, pending(None))[0][0].replica_id
    second = choose(router, candidates, pending(None))[0][0].replica_id
    assert first != second
    assert sum(router.outstanding().values()) == 200
    router._drop_unconfirmed(float("inf"))  # as UNCONFIRMED_TTL_S later
    assert router.outstanding() == {}


def test_several_routers_each_even_keep_the_replicas_even():
    """Four ingress replicas, each routing jobs of mixed sizes by what it alone sent, in a random
    interleaving: the two scorers' outstanding tokens differ by at most one largest job per
    router (random routing drifts apart by about sqrt(jobs) jobs: some 45 here)."""
    rng = random.Random(0)
    routers = [new_router() for _ in range(4)]
    candidates = replicas("a", "b")
    sizes = [500, 2000, 2000, 2000, 8000]
    for _ in range(2000):
        router = rng.choice(routers)
        send(router, candidates, pending(None, tokens=rng.choice(sizes)))
        totals = Counter()
        for router_ in routers:
            totals.update({r.unique_id: t for r, t in router_.outstanding().items()})
        assert abs(totals["a"] - totals["b"]) <= len(routers) * max(sizes), totals


def test_an_adapters_jobs_go_to_its_home_replica_from_every_router_and_adapters_spread():
    """A job of a LoRA adapter has no prefix key: it is routed on its adapter, so that one
    replica keeps each adapter loaded; jobs of the model alone still go by load."""
    candidates = replicas("a", "b")
    homes = {}
    for adapter in range(1, 41):
        homes[adapter] = send(new_router(), candidates, pending(None, adapter=adapter))
        router = new_router()  # another ingress process, busy elsewhere: the same home
        for _ in range(3):
            assert send(router, candidates[::-1], pending(None, adapter=adapter)) \
                == homes[adapter]
    assert 10 <= Counter(h.unique_id for h in homes.values())["a"] <= 30
    router = new_router()
    chosen = {send(router, candidates, pending(None)) for _ in range(4)}
    assert len(chosen) == 2  # the model's own jobs: by outstanding tokens, both replicas


def test_a_models_jobs_go_to_a_replica_holding_it_else_to_one_holding_fewer_models():
    """A job of one of `models`: first the replicas that hold it, then the ones that hold
    fewer models, so that a model loads where it displaces none; from every router alike."""
    def home(model: str, candidates, router=None) -> str:
        chosen = send(router or new_router(), candidates, pending(None, model=model))
        return chosen.unique_id

    for held_by in ("a", "b"):  # whichever replica its hash favours
        candidates = replicas("a", "b", models={held_by: {"m1"}})
        for k in range(20):
            assert home("m1", candidates) == held_by
            assert home(f"new{k}", candidates) != held_by  # the one holding none
            assert home(f"new{k}", candidates[::-1]) != held_by
    both = replicas("a", "b", models={"a": {"m1"}, "b": {"m2"}})
    homes = {home(f"m{k}", both) for k in range(3, 40)}  # neither holds it: by hash
    assert homes == {"a", "b"}
    for k in range(3, 40):
        assert home(f"m{k}", both) == home(f"m{k}", both[::-1])
    router = new_router()  # a busy holder spills past the load bound
    spilled = Counter(home("m1", both, router) for _ in range(20))  # none completes
    assert spilled["a"] > spilled["b"] > 0
