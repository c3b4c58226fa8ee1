"""Prefix-affinity routing (ranker_app/prefix_router.py) without a cluster: Serve's own
RequestRouter base class, fed replicas and pending jobs the way Serve's router does."""

from __future__ import annotations

import asyncio
from collections import Counter
from types import SimpleNamespace

from ray.serve._private.common import DeploymentHandleSource, DeploymentID, ReplicaID

from ranker_app.prefix_router import PrefixAffinityRouter
from ranker_contract.packing import ScoreJob

DEPLOYMENT = DeploymentID(name="ScoreWorker", app_name="score")


def replicas(*names: str) -> list[SimpleNamespace]:
    return [SimpleNamespace(replica_id=ReplicaID(unique_id=n, deployment_id=DEPLOYMENT))
            for n in names]


def pending(key: str | None) -> SimpleNamespace:
    return SimpleNamespace(args=[ScoreJob([], [1], key)],
                           routing_context=SimpleNamespace(should_backoff=False))


def new_router() -> PrefixAffinityRouter:
    return PrefixAffinityRouter(DEPLOYMENT, DeploymentHandleSource.UNKNOWN)


def choose(router, candidates, key):
    return asyncio.run(router.choose_replicas(candidates, pending(key)))


def first_choice(router, candidates, key) -> str:
    return choose(router, candidates, key)[0][0].replica_id.unique_id


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


def test_every_replica_is_a_fallback_in_hash_order():
    router = new_router()
    tiers = choose(router, replicas("a", "b", "c"), "00ff")
    assert [len(t) for t in tiers] == [1, 1, 1]
    assert {t[0].replica_id.unique_id for t in tiers} == {"a", "b", "c"}


def test_a_hot_key_spills_past_its_share_and_comes_back_when_load_drops():
    router = new_router()
    candidates = replicas("a", "b", "c", "d")
    owner = first_choice(router, candidates, "hot")
    sent = Counter()
    for _ in range(40):  # none completes: the owner fills up to its bound, then others take it
        chosen = choose(router, candidates, "hot")[0][0].replica_id
        router.on_send_request(chosen)
        sent[chosen.unique_id] += 1
    mean = 40 / 4
    assert sent[owner] <= max(1.25 * mean, mean + 2) + 1, sent
    assert len(sent) > 1
    for replica in candidates:  # everything done: the owner again
        for _ in range(sent[replica.replica_id.unique_id]):
            router.on_request_completed(replica.replica_id, "id")
    assert first_choice(router, candidates, "hot") == owner


def test_a_replica_that_goes_moves_only_its_own_keys():
    router = new_router()
    four, three = replicas("a", "b", "c", "d"), replicas("a", "b", "c")
    keys = [f"k{k}" for k in range(200)]
    before = {key: first_choice(router, four, key) for key in keys}

    async def lose_d():  # Serve calls it on its event loop
        router.update_replicas(three)
    asyncio.run(lose_d())
    after = {key: first_choice(router, three, key) for key in keys}
    for key in keys:
        if before[key] != "d":
            assert after[key] == before[key]
    assert any(before[key] == "d" for key in keys)


def test_a_job_without_a_key_goes_to_the_shorter_queue_of_two():
    router = new_router()
    tiers = choose(router, replicas("a", "b", "c", "d"), None)
    assert len(tiers) == 1 and len(tiers[0]) == 2
    assert len(choose(router, replicas("a"), "key")[0]) == 1
