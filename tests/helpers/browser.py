"""A real headless Chromium (Debian's ``chromium``) driven over the Chrome DevTools Protocol with
aiohttp's websocket client — no browser-automation package needed, nothing downloaded.

    async with HeadlessChromium(tmp_path) as browser:
        await browser.goto(url)
        await browser.wait_for("document.querySelectorAll('td.cell').length == 4")
        await browser.screenshot(path)
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "chrome")


def chromium_binary() -> str | None:
    return next((path for name in CANDIDATES if (path := shutil.which(name))), None)


class BrowserError(Exception):
    pass


class HeadlessChromium:
    def __init__(self, profile_dir: Path, *, width: int = 1280, height: int = 900) -> None:
        binary = chromium_binary()
        if binary is None:
            raise BrowserError("no Chromium found (Debian: apt-get install chromium)")
        self.profile_dir = profile_dir
        self.argv = [binary, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--no-first-run", "--no-default-browser-check", "--remote-debugging-port=0",
                     f"--user-data-dir={profile_dir}", f"--window-size={width},{height}", "about:blank"]
        self.process: subprocess.Popen[bytes] | None = None
        self._ids = itertools.count(1)
        self._session: Any = None
        self._socket: Any = None
        self.console: list[str] = []
        self._scratch = ""

    async def __aenter__(self) -> HeadlessChromium:
        import aiohttp

        # Chromium's own temporary folders (it leaves some behind) in one of ours, removed on exit;
        # a short path, since Chromium puts Unix sockets there (108 bytes at most)
        self._scratch = tempfile.mkdtemp(prefix="chromium-")
        self.process = subprocess.Popen(self.argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                        env={**os.environ, "TMPDIR": self._scratch})
        port_file = self.profile_dir / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        while not port_file.exists() or not port_file.read_text().strip():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise BrowserError(f"Chromium did not start (exit code {self.process.poll()})")
            await asyncio.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        self._session = aiohttp.ClientSession()
        async with self._session.get(f"http://127.0.0.1:{port}/json/list") as response:
            pages = [t for t in await response.json() if t.get("type") == "page"]
        self._socket = await self._session.ws_connect(pages[0]["webSocketDebuggerUrl"], max_msg_size=0)
        await self.send("Page.enable")
        await self.send("Runtime.enable")
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._socket is not None:
            await self._socket.close()
        if self._session is not None:
            await self._session.close()
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        if self._scratch:
            shutil.rmtree(self._scratch, ignore_errors=True)

    async def send(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        message_id = next(self._ids)
        await self._socket.send_str(json.dumps({"id": message_id, "method": method, "params": params or {}}))
        while True:
            message = json.loads((await self._socket.receive(timeout=60)).data)
            if message.get("method") == "Runtime.consoleAPICalled":
                self.console.append(" ".join(str(a.get("value", a.get("description", "")))
                                             for a in message["params"]["args"]))
            if message.get("id") == message_id:
                if "error" in message:
                    raise BrowserError(f"{method}: {message['error']}")
                result: dict[str, Any] = message.get("result", {})
                return result

    async def goto(self, url: str) -> None:
        await self.send("Page.navigate", {"url": url})

    async def evaluate(self, expression: str) -> Any:
        result = await self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                      "awaitPromise": True})
        if "exceptionDetails" in result:
            raise BrowserError(f"{expression!r} raised {result['exceptionDetails'].get('text')}")
        return result["result"].get("value")

    async def wait_for(self, expression: str, timeout_s: float = 30.0) -> Any:
        """Poll ``expression`` in the page until it is truthy; its value."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                value = await self.evaluate(expression)
            except BrowserError:
                value = None
            if value:
                return value
            if time.monotonic() > deadline:
                raise BrowserError(f"timed out waiting for {expression!r}")
            await asyncio.sleep(0.25)

    async def screenshot(self, path: Path) -> None:
        result = await self.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True})
        path.write_bytes(base64.b64decode(result["data"]))
