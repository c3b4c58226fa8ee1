"""Screenshot of the Ray dashboard's Serve page, authenticated as a user does, in a real
headless browser.

Opens the page in Chromium (Debian: `apt-get install -y chromium`) driven over its DevTools
protocol, types the token of `ray get-auth-token` into the "Authentication Token Required"
dialog, waits until both deployments show, and saves the page.

Usage: python -m tools.screenshot_dashboard                  # starts configs/score.yaml
       python -m tools.screenshot_dashboard --dashboard URL  # a dashboard already up
Writes docs/img/ray_dashboard_serve.png (--out to change).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import itertools
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

from tools import REPO_ROOT
from tools.ray_dashboard import auth_token

OUT = REPO_ROOT / "docs" / "img" / "ray_dashboard_serve.png"
WIDTH, HEIGHT = 1600, 1000
WAIT_S = 120
SHOWN = ("ScoreIngress", "ScoreWorker", "HEALTHY")  # the Serve page is ready when it shows these


def find_chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if path := shutil.which(name):
            return path
    raise FileNotFoundError("no chromium: `apt-get install -y chromium` (Debian)")


class DevTools:
    """One page of a browser, over the Chrome DevTools protocol."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws, self.ids = ws, itertools.count(1)

    async def send(self, method: str, **params) -> dict:
        msg_id = next(self.ids)
        await self.ws.send_json({"id": msg_id, "method": method, "params": params})
        async for msg in self.ws:  # events in between are not needed here
            data = json.loads(msg.data)
            if data.get("id") == msg_id:
                if "error" in data:
                    raise RuntimeError(f"{method}: {data['error']}")
                return data["result"]
        raise RuntimeError("the browser closed the connection")

    async def text(self) -> str:
        result = await self.send("Runtime.evaluate", expression="document.body ? "
                                 "document.body.innerText : ''", returnByValue=True)
        return result["result"].get("value", "")

    async def wait_for_text(self, *needles: str) -> None:
        deadline = time.monotonic() + WAIT_S
        while True:
            try:
                text = await self.text()
            except RuntimeError:  # the page is reloading (it does after the token is taken)
                text = ""
            if all(needle in text for needle in needles):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"page never showed {needles}; it shows:\n{text[:2000]}")
            await asyncio.sleep(0.5)


async def shoot(dashboard: str, token: str, out: Path, browser_port: int) -> None:
    async with aiohttp.ClientSession() as http:
        async with http.get(f"http://127.0.0.1:{browser_port}/json/list") as resp:
            page = next(t for t in await resp.json() if t["type"] == "page")
        async with http.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0) as ws:
            tab = DevTools(ws)
            await tab.send("Emulation.setDeviceMetricsOverride", width=WIDTH, height=HEIGHT,
                           deviceScaleFactor=1, mobile=False)
            await tab.send("Page.navigate", url=f"{dashboard}/#/serve")
            await tab.wait_for_text("Authentication Token Required")
            # As a user: type the token into the dialog's field and press Enter.
            await tab.send("Runtime.evaluate", expression="document.querySelector("
                           "'[role=dialog] input').focus()")
            await tab.send("Input.insertText", text=token)
            for kind in ("keyDown", "keyUp"):
                await tab.send("Input.dispatchKeyEvent", type=kind, key="Enter", code="Enter",
                               windowsVirtualKeyCode=13)
            await tab.wait_for_text(*SHOWN)  # the page reloads with the cookie set
            await asyncio.sleep(2)  # let the tables finish rendering
            shot = await tab.send("Page.captureScreenshot", format="png")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(base64.b64decode(shot["data"]))


def screenshot(dashboard: str, out: Path) -> None:
    profile = Path(tempfile.mkdtemp(prefix="chromium-"))
    browser = subprocess.Popen(
        [find_chromium(), "--headless=new", "--no-sandbox", "--disable-gpu",
         "--no-first-run", "--remote-debugging-port=0", f"--user-data-dir={profile}",
         f"--window-size={WIDTH},{HEIGHT}", "about:blank"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        port_file = profile / "DevToolsActivePort"  # Chromium writes its port here
        deadline = time.monotonic() + 60
        while not port_file.is_file() or not port_file.read_text().strip():
            if time.monotonic() > deadline or browser.poll() is not None:
                raise RuntimeError("chromium did not open its DevTools port")
            time.sleep(0.2)
        port = int(port_file.read_text().split()[0])
        asyncio.run(shoot(dashboard, auth_token(), out, port))
    finally:
        browser.terminate()
        browser.wait(timeout=30)
        shutil.rmtree(profile, ignore_errors=True)
    print(f"wrote {out}")


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m tools.screenshot_dashboard",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--dashboard", help="URL of a running dashboard (default: start the service)")
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args()
    find_chromium()
    if args.dashboard:
        screenshot(args.dashboard, args.out)
        return 0
    from tools.configs import shipped_yaml
    from tools.service import start_service, stop_service

    svc = start_service(shipped_yaml("score.yaml"))
    try:
        screenshot(svc.dashboard_url(), args.out)
    finally:
        stop_service(svc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
