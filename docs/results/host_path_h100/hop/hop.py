"""Round trip of a Serve handle call between two deployments vs a raw Ray actor call, with a job
of 3,000 token ids, both ends returning at once (CPU, one machine)."""
import asyncio, json, os, statistics, sys, time
import ray
from ray import serve

PAYLOAD = {"ids": list(range(3000)), "labels": [1, 2]}


@serve.deployment(max_ongoing_requests=1024)
class Echo:
    async def score(self, job):
        return [[0.0, 0.0]] * 10


@serve.deployment
class Caller:
    def __init__(self, echo):
        self.echo = echo

    async def run(self, n: int):
        out = []
        for _ in range(n):
            t = time.perf_counter()
            await self.echo.score.remote(PAYLOAD)
            out.append((time.perf_counter() - t) * 1e3)
        return out


@ray.remote
class RawEcho:
    async def score(self, job):
        return [[0.0, 0.0]] * 10


@ray.remote
class RawCaller:
    def __init__(self, echo):
        self.echo = echo

    async def run(self, n):
        out = []
        for _ in range(n):
            t = time.perf_counter()
            await self.echo.score.remote(PAYLOAD)
            out.append((time.perf_counter() - t) * 1e3)
        return out


def summary(xs):
    xs = sorted(xs[20:])
    return {"p50": round(statistics.median(xs), 3), "p90": round(xs[int(0.9 * len(xs))], 3)}


ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
res = {"throughput_optimized": os.environ.get("RAY_SERVE_THROUGHPUT_OPTIMIZED")}
h = serve.run(Caller.bind(Echo.bind()), name="hop", route_prefix=None)


async def drive():
    app = serve.get_app_handle("hop")
    res["serve_handle_ms"] = summary(await app.run.remote(300))
    res["serve_handle_ms_again"] = summary(await app.run.remote(300))
asyncio.run(drive())
raw = RawCaller.remote(RawEcho.remote())
res["ray_actor_ms"] = summary(ray.get(raw.run.remote(300)))
print(json.dumps(res), flush=True)
os._exit(0)
