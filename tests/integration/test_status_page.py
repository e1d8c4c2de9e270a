"""The gateway's status page in a real headless Chromium against a real cluster with API keys:
the page asks for the key, shows the shards × replicas grid, sees a replica killed with -9 go
down and come back with its restart count, shows a lexical index once a lexical query built it,
and draws traffic. A screenshot is saved (set
STATUS_SCREENSHOT=docs/status-page.png to refresh the one the docs show)."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import threading
from pathlib import Path

import httpx
import pytest

from index_shards.build import BuildConfig, build_collection
from serving.gateway.config import GatewayConfig
from serving.local.launcher import LocalCluster
from tests.helpers.browser import HeadlessChromium, chromium_binary

pytestmark = pytest.mark.slow

READ_KEY = "status-page-read-key"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, msmarco):
    root = tmp_path_factory.mktemp("root")
    build_collection(root, msmarco.documents[:800], msmarco.vectors[:800], msmarco.version, BuildConfig("web", 2),
                     show_progress=False)
    with LocalCluster(root, "web", replicas=2, gateway=GatewayConfig.from_dict({"encoder": {"load": False}}),
                      workdir=tmp_path_factory.mktemp("work"),
                      api_keys=[f"read:{READ_KEY}", "admin:status-page-admin-key"],
                      internal_token="status-internal") as running:
        yield running


def test_status_page_in_a_real_browser(cluster, msmarco, tmp_path):
    if chromium_binary() is None:
        pytest.fail("Chromium is not installed: .ci/run installs Debian's chromium (apt-get install chromium)")
    stop = threading.Event()

    def traffic() -> None:  # real queries, so the charts have something to draw
        with httpx.Client(base_url=cluster.gateway_url, headers={"authorization": f"Bearer {READ_KEY}"},
                          timeout=10) as client:
            i = 0
            while not stop.is_set():
                client.post("/v1/query", json={"vector": msmarco.query_vectors[i % 50].tolist(), "k": 5})
                i += 1

    async def scenario() -> None:
        async with HeadlessChromium(tmp_path / "profile") as browser:
            await browser.goto(cluster.gateway_url + "/")
            # no key yet: /v1/cluster is 401 and the page asks for one
            await browser.wait_for("getComputedStyle(document.getElementById('keybox')).display === 'block'")
            await browser.evaluate(f"document.getElementById('key').value = {READ_KEY!r}; "
                                   "document.getElementById('savekey').click(); true")
            cells = "document.querySelectorAll('#replica-grid td.cell')"
            await browser.wait_for(f"{cells}.length === 4 && [...{cells}].every(c => c.dataset.health === 'up')")
            for shard in cluster.shards:
                for child in shard:
                    assert await browser.evaluate(f"document.body.innerText.includes({child.ready['url']!r})")
            assert await browser.evaluate("document.getElementById('summary').innerText.includes('every shard')")
            assert await browser.evaluate("sessionStorage.getItem('shardrag_key')") == READ_KEY
            # a lexical query builds the replicas' BM25 indexes; each cell that served it shows its size
            assert not await browser.evaluate(f"[...{cells}].some(c => c.innerText.includes('lexical'))")
            httpx.post(cluster.gateway_url + "/v1/query", json={"text": "what is a shard", "mode": "lexical"},
                       headers={"authorization": f"Bearer {READ_KEY}"}, timeout=30).raise_for_status()
            await browser.wait_for(f"poll().then(() => [...{cells}].some(c => /lexical [0-9.]+ MiB/"
                                   ".test(c.innerText)))", timeout_s=30)

            victim = cluster.shards[0][1]
            os.kill(victim.process.pid, signal.SIGKILL)
            cell = "document.querySelector('td.cell[data-shard=\"0\"][data-replica=\"1\"]')"
            # poll() is the page's own refresh; calling it often catches the short window it is down
            await browser.wait_for(f"poll().then(() => {cell}.dataset.health === 'down')", timeout_s=30)
            await browser.wait_for(f"poll().then(() => {cell}.dataset.health === 'up' && "
                                   f"{cell}.dataset.restarts === '1')", timeout_s=60)
            assert await browser.evaluate(f"{cell}.querySelector('.restarts').innerText") == "1"
            await browser.wait_for("Number(document.getElementById('qps-now').innerText) > 0", timeout_s=30)
            assert await browser.evaluate("document.querySelector('#qps polyline') !== null")
            path = tmp_path / "status-page.png"
            await browser.screenshot(path)
            assert path.stat().st_size > 10_000 and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
            target = os.environ.get("STATUS_SCREENSHOT")
            if target:
                shutil.copyfile(path, Path(target))

    worker = threading.Thread(target=traffic, daemon=True)
    worker.start()
    try:
        asyncio.run(scenario())
    finally:
        stop.set()
        worker.join(timeout=10)


def test_the_page_is_served_without_a_key_and_the_data_is_not(cluster):
    page = httpx.get(cluster.gateway_url + "/", timeout=10)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert b"shardrag" in page.content and b"<script" in page.content
    assert b'src="http' not in page.content and b'href="http' not in page.content  # no external assets: works offline
    assert httpx.get(cluster.gateway_url + "/v1/cluster", timeout=10).status_code == 401
