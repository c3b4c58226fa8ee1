"""The scorer load policy as a pure function of Serve's AutoscalingContext."""

import pytest
from ray.serve._private.common import DeploymentID, ReplicaID
from ray.serve.config import AutoscalingContext

from ranker_app.autoscaling_policy import ScorerLoadPolicy

DEPLOYMENT = DeploymentID(name="ScoreWorker", app_name="score")


def _context(queued: list[float] | None, inflight: list[float] | None, target: int = 2,
             refused: list[float] | None = None, demand: list[float] | None = None):
    """Context for `target` replicas whose reported averages are `queued` / `inflight` (and
    `refused` tokens per second and `demand` shares, when given)."""
    replicas = [ReplicaID(f"r{i}", DEPLOYMENT) for i in range(target)]
    metrics = None
    if queued is not None:
        metrics = {"queued_tokens": dict(zip(replicas, queued)),
                   "inflight_tokens": dict(zip(replicas, inflight))}
    if refused is not None:
        metrics["refused_tokens_per_s"] = dict(zip(replicas, refused))
    if demand is not None:
        metrics["demand_share"] = dict(zip(replicas, demand))
    return AutoscalingContext(
        deployment_id=DEPLOYMENT, deployment_name="ScoreWorker", app_name="score",
        current_num_replicas=target, target_num_replicas=target, running_replicas=replicas,
        total_num_requests=7.0, total_queued_requests=0.0, aggregated_metrics=metrics,
        raw_metrics=None, capacity_adjusted_min_replicas=1, capacity_adjusted_max_replicas=4,
        policy_state={}, last_scale_up_time=None, last_scale_down_time=None, current_time=100.0,
        config=None)


def test_desired_replicas_cover_all_tokens_at_the_target_per_replica():
    policy = ScorerLoadPolicy(target_tokens_per_replica=10_000)
    # 2 replicas: 30k + 5k queued, 8k + 8k running = 51k tokens → 6 replicas of 10k.
    desired, state = policy(_context([30_000, 5_000], [8_000, 8_000]))
    assert desired == 6 and state == {"tokens": 51_000, "refused_tokens": 0, "demand_share": 0}


def test_refused_demand_still_asks_for_replicas():
    """A replica that sheds its excess holds a short queue; the tokens it refused per second
    count as queued, so the excess still adds replicas."""
    policy = ScorerLoadPolicy(target_tokens_per_replica=10_000)
    assert policy(_context([2_000], [8_000], target=1))[0] == 1  # full, nothing refused
    desired, state = policy(_context([2_000], [8_000], target=1, refused=[15_000]))
    assert desired == 3 and state["refused_tokens"] == 15_000


def test_exactly_at_target_keeps_the_count_and_idle_asks_for_none():
    policy = ScorerLoadPolicy(target_tokens_per_replica=10_000)
    assert policy(_context([6_000, 4_000], [5_000, 5_000]))[0] == 2
    # Zero is what the work asks for; Serve's min_replicas bound is applied after the policy.
    assert policy(_context([0, 0], [0, 0]))[0] == 0


def test_one_token_over_the_target_adds_a_replica():
    policy = ScorerLoadPolicy(target_tokens_per_replica=10_000)
    assert policy(_context([10_001], [0], target=1))[0] == 2


def test_no_reports_yet_holds_the_current_target():
    assert ScorerLoadPolicy(1_000)(_context(None, None, target=3)) == (3, {"tokens": None})


@pytest.mark.parametrize("target", [0, -5])
def test_target_must_be_positive(target):
    with pytest.raises(ValueError, match="target_tokens_per_replica"):
        ScorerLoadPolicy(target)


def test_demand_near_capacity_asks_for_a_replica_before_any_queue_forms():
    """One replica computing 80% of its capacity with a short queue: the tokens ask for 1
    replica, the demand share for ceil(0.8 / 0.7) = 2."""
    policy = ScorerLoadPolicy(target_tokens_per_replica=10_000, target_demand_share=0.7)
    desired, state = policy(_context([0], [4_000], target=1, demand=[0.8]))
    assert desired == 2 and state["demand_share"] == 0.8
    # Two replicas sharing more than one can take (0.45 + 0.4) keep two; at 0.3 + 0.3 one is enough.
    assert policy(_context([0, 0], [2_000, 2_000], demand=[0.45, 0.4]))[0] == 2
    assert policy(_context([0, 0], [2_000, 2_000], demand=[0.3, 0.3]))[0] == 1
    # The tokens still win when they ask for more.
    assert policy(_context([25_000], [4_000], target=1, demand=[0.9]))[0] == 3


def test_the_demand_share_is_ignored_unless_a_target_is_set():
    policy = ScorerLoadPolicy(target_tokens_per_replica=10_000)
    assert policy(_context([0], [4_000], target=1, demand=[1.0]))[0] == 1


@pytest.mark.parametrize("share", [-0.1, 1.5])
def test_demand_target_must_be_a_share(share):
    with pytest.raises(ValueError, match="target_demand_share"):
        ScorerLoadPolicy(10_000, target_demand_share=share)
