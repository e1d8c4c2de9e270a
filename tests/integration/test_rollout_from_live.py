"""A rollout after the write-ahead logs have rolled over (issue 33, item 4): staging replayed the
active version's writes from seq 0, so once compaction had dropped the log behind its checkpoint
every rollout failed — and while the history existed it re-embedded all of it holding every write
lock. Now ``shardrag build --collection`` builds the new version from the live documents and
records the cut each shard was read at; activation replays only the writes after it (while writes
go on), and the new version holds every document with its newest content."""

from __future__ import annotations

import subprocess
import sys
import time

import httpx
import pytest

from index_shards.build import BuildConfig, build_collection
from index_shards.layout import resolve_version, shard_dir
from index_shards.manifest import read_shard_manifest
from retrieval.encoders import default_model_dir
from serving.gateway.config import GatewayConfig
from serving.local.launcher import LocalCluster
from tests.helpers.checkpoints import perturbed_checkpoint
from tests.helpers.roles import primary_index

pytestmark = pytest.mark.slow
BUILT = 200


def test_a_version_built_from_the_live_collection_rolls_out_after_the_logs_rolled_over(tmp_path, msmarco):
    root = tmp_path / "root"
    documents = msmarco.documents[:BUILT]
    build_collection(root, documents, msmarco.vectors[:BUILT], msmarco.version, BuildConfig("live", 2),
                     show_progress=False)
    model = perturbed_checkpoint(default_model_dir(), tmp_path / "models" / "tuned", seed=1, scale=0.02)
    config = GatewayConfig.from_dict({"gate": {"busy_share": 1.0, "sample": 10}, "rollout": {"drain_s": 0.5},
                                      "encoder": {"workers": 1}})
    shard_args = ("--compact-after", "30", "--wal-retain", "0", "--wal-file-mb", "0.002")
    with LocalCluster(root, "live", replicas=2, gateway=config, workdir=tmp_path / "work",
                      shard_args=shard_args) as cluster, \
            httpx.Client(base_url=cluster.gateway_url, timeout=120) as http:
        texts = {f"w-{i}": f"{msmarco.documents[BUILT + i].text}" for i in range(120)}
        for start in range(0, 120, 20):
            reply = http.post("/v1/documents", json={"write_ack": "all", "documents": [
                {"id": doc_id, "text": text} for doc_id, text in list(texts.items())[start:start + 20]]})
            assert reply.status_code == 200, reply.text
        for shard in range(2):  # compacted, the log behind the checkpoint dropped
            urls = cluster.shard_urls[shard]
            deadline = time.monotonic() + 30
            primary = urls[primary_index(urls)]
            while httpx.get(f"{primary}/v1/writes", params={"version": msmarco.version.id, "after": 0},
                            timeout=10).status_code != 404:
                assert time.monotonic() < deadline, "the primary never dropped its early log"
                time.sleep(0.5)

        built = subprocess.run([sys.executable, "-m", "serving", "build", "--collection", "live", "--root", str(root),
                                "--model", str(model), "--device", "cpu", "--no-cache"],
                               capture_output=True, text=True, timeout=600)
        assert built.returncode == 0, built.stderr
        v1 = msmarco.version.id
        v2 = next(p.name for p in (root / "live").iterdir() if p.is_dir() and p.name not in (v1, "replicas"))
        manifest = read_shard_manifest(shard_dir(resolve_version(root, "live", v2)[0], 0))
        assert manifest.source_version == v1 and manifest.source_seqs is not None
        assert manifest.count + read_shard_manifest(shard_dir(resolve_version(root, "live", v2)[0], 1)).count == \
            BUILT + 120  # the build read the written documents too

        # writes after the build: the rollout must replay exactly these (an update, a delete, new ones)
        after = {"w-0": "an updated passage about glaciers carving fjords", "late-1": "a passage written late"}
        assert http.post("/v1/documents", json={"write_ack": "all", "documents": [
            {"id": doc_id, "text": text} for doc_id, text in after.items()]}).status_code == 200
        assert http.post("/v1/documents/delete", json={"ids": ["w-1"], "write_ack": "all"}).status_code == 200

        assert http.post("/admin/rollout/stage", json={"version": v2, "model": str(model)}).status_code == 200
        deadline = time.monotonic() + 180
        while True:
            state = http.get("/admin/rollout").json()
            rows = [r for rows in state["replicas"].get(v2, {}).values() for r in rows]
            if rows and all(r["state"] == "ready" for r in rows) and state["encoders"][v2]["state"] == "ready":
                break
            assert time.monotonic() < deadline, state
            time.sleep(0.5)
        activated = http.post("/admin/rollout/activate", json={"version": v2, "force": True})
        assert activated.status_code == 200, activated.text
        body = activated.json()
        assert body["state"]["active"] == v2 and body["gateways_behind"] == []
        kinds = [e["kind"] for e in body["state"]["events"]]
        assert kinds[-2:] == ["VersionSynced", "VersionActivated"]

        assert http.get("/v1/documents/w-0").json()["text"] == after["w-0"]
        assert http.get("/v1/documents/late-1").json()["text"] == after["late-1"]
        assert http.get("/v1/documents/w-1").status_code == 404
        assert http.get("/v1/documents/w-119").json()["text"] == texts["w-119"]
        assert http.get(f"/v1/documents/{documents[5].doc_id}").status_code == 200
        counts = sum(httpx.get(f"{cluster.shard_urls[s][0]}/admin/digest", params={"version": v2},
                               timeout=30).json()["count"] for s in range(2))
        assert counts == BUILT + 120 + 1 - 1
        # and a write now goes to both versions (the previous one stays loaded for a rollback)
        reply = http.post("/v1/documents", json={"documents": [{"id": "after-rollout", "text": "both versions"}],
                                                 "write_ack": "all"})
        assert reply.status_code == 200
        for version in (v1, v2):
            holder = next(u for row in cluster.shard_urls for u in row
                          if httpx.get(f"{u}/v1/documents/after-rollout", params={"version": version},
                                       timeout=10).status_code == 200)
            assert holder
