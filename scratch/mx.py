import httpx, time, sys
import tools.service as tooling
from tools.prom import scrape
from tools.random_model import make_random_model
from pathlib import Path
m = make_random_model(Path("/tmp/mxsmall"), "small") if not Path("/tmp/mxsmall/config.json").exists() else Path("/tmp/mxsmall")
config = tooling.small_model_config(m)
args = config["applications"][0]["args"]
args["models"] = [{"name": "copy", "path": str(m)}]
with tooling.serving(config, tooling.FAST_METRICS_ENV) as svc:
    r = httpx.post(f"{svc.url}/v1/score", json={"query": [1,2], "items": [[3]], "label_token_ids": [1], "model": "copy"}, timeout=60)
    print(r.status_code, r.text[:200])
    time.sleep(8)
    for name, labels, value in scrape(svc.metrics_url()):
        if "multiplex" in name:
            print(name, labels, value)
