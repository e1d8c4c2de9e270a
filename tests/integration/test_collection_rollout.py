"""A created text collection re-embedded in place (issue 35: rollout under
/v1/collections/{name}/…), on a real local cluster with two nodes and a 2-shard × 2-replica
collection. First a model the quality gate refuses: aborted, staged again and forced in — what
the first attempt left in it is cleaned up. Then a new model staged (its nodes build an empty
version of it) and activated while a writer and a reader keep going: the new version is filled
from the live documents, the writes after the cut replayed, then the old one retired. Every
acknowledged write is in the new version with its newest content, no deleted document comes back,
no query fails, and a node killed afterwards comes back on the new version, caught up."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest

from index_shards.build import BuildConfig, build_collection
from retrieval.client import ShardragClient
from retrieval.encoders import default_model_dir
from serving.gateway.config import GatewayConfig
from serving.local.launcher import LocalCluster
from tests.helpers.checkpoints import perturbed_checkpoint

# alone (tests/sharing.py): no query under its load may miss the default 5 s deadline while the
# collection is re-encoded (one did, beside another test)
pytestmark = [pytest.mark.slow, pytest.mark.alone]

CONFIG = GatewayConfig.from_dict({"gate": {"busy_share": 1.0, "sample": 10}, "rollout": {"drain_s": 0.5},
                                  "encoder": {"workers": 1}})
FIRST = 80


class Traffic:
    """A writer (new ids, overwrites, deletes) and a text reader on the collection, each keeping
    what the gateway acknowledged: the ledger is every document's newest acknowledged state."""

    def __init__(self, url: str, name: str, texts: list[str]) -> None:
        self.url, self.name, self.texts = url, name, texts
        self.ledger: dict[str, str | None] = {}
        self.write_errors: list[str] = []
        self.query_errors: list[str] = []
        self.queries = 0
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._write, daemon=True),
                        threading.Thread(target=self._read, daemon=True)]

    def __enter__(self) -> Traffic:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=120)

    def _write(self) -> None:
        with httpx.Client(base_url=f"{self.url}/v1/collections/{self.name}", timeout=120) as http:
            step = 0
            while not self.stop.is_set():
                step += 1
                if step % 5 == 0:  # a delete of a first-wave document
                    doc_id = f"d-{(step * 7) % FIRST}"
                    reply = http.post("/documents/delete", json={"ids": [doc_id]})
                    if reply.status_code == 200:
                        self.ledger[doc_id] = None
                    else:
                        self.write_errors.append(f"delete {doc_id}: {reply.status_code} {reply.text[:200]}")
                    continue
                # an overwrite of a first-wave document, or a new one
                doc_id = f"d-{(step * 3) % FIRST}" if step % 2 else f"new-{step}"
                text = f"{self.texts[step % len(self.texts)]} (revision {step})"
                reply = http.post("/documents", json={"documents": [{"id": doc_id, "text": text}]})
                if reply.status_code == 200:
                    self.ledger[doc_id] = text
                else:
                    self.write_errors.append(f"upsert {doc_id}: {reply.status_code} {reply.text[:200]}")
                time.sleep(0.05)

    def _read(self) -> None:
        with httpx.Client(base_url=f"{self.url}/v1/collections/{self.name}", timeout=60) as http:
            while not self.stop.is_set():
                reply = http.post("/query", json={"text": self.texts[self.queries % len(self.texts)], "k": 5})
                self.queries += 1
                if reply.status_code != 200:
                    self.query_errors.append(f"{reply.status_code} {reply.text[:200]}")
                time.sleep(0.02)


def wait_ready(http: httpx.Client, version: str) -> None:
    """Until every replica holds ``version`` ready and the gateway its encoder."""
    deadline = time.monotonic() + 180
    while True:
        status = http.get("/v1/collections/notes/rollout").json()
        rows = [r for shard in status["replicas"].get(version, {}).values() for r in shard]
        if len(rows) == 4 and all(r["state"] == "ready" for r in rows) and \
                status["encoders"].get(version, {}).get("state") == "ready":
            return
        assert time.monotonic() < deadline, status
        time.sleep(0.5)


def test_a_created_collection_is_re_embedded_in_place_while_it_serves(tmp_path, msmarco):
    root = tmp_path / "root"
    build_collection(root, msmarco.documents[:20], msmarco.vectors[:20], msmarco.version, BuildConfig("base", 1),
                     show_progress=False)
    model = perturbed_checkpoint(default_model_dir(), tmp_path / "models" / "tuned", seed=3, scale=0.02)
    noisy = perturbed_checkpoint(default_model_dir(), tmp_path / "models" / "noisy", seed=4, scale=1.0)
    texts = [d.text for d in msmarco.documents[20:220]]
    with LocalCluster(root, "base", replicas=1, gateway=CONFIG, nodes=2, workdir=tmp_path / "work") as cluster, \
            httpx.Client(base_url=cluster.gateway_url, timeout=300) as http:
        created = http.put("/v1/collections/notes", json={"model": "default", "shards": 2, "replicas": 2})
        assert created.status_code == 201, created.text
        first: dict[str, str | None] = {f"d-{i}": texts[i] for i in range(FIRST)}
        items = list(first.items())
        for start in range(0, FIRST, 20):
            reply = http.post("/v1/collections/notes/documents", json={"documents": [
                {"id": doc_id, "text": text} for doc_id, text in items[start:start + 20]]})
            assert reply.status_code == 200, reply.text
        # one kept without a vector: every version the rollouts make holds it without one
        bare_text = "a note kept for its words alone"
        reply = http.post("/v1/collections/notes/documents", json={"documents": [
            {"id": "bare-note", "text": bare_text, "no_vector": True}]})
        assert reply.status_code == 200, reply.text
        first["bare-note"] = bare_text

        # refused with the field named: a vector-only collection has nothing to re-embed
        assert http.put("/v1/collections/vectors", json={"dim": 4}).status_code == 201
        refused = http.post("/v1/collections/vectors/rollout/stage", json={"model": str(model)})
        assert refused.status_code == 422 and refused.json()["error"]["field"] == "model", refused.text
        bad = http.post("/v1/collections/notes/rollout/stage", json={"model": str(tmp_path / "no-such-model")})
        assert bad.status_code == 422 and bad.json()["error"]["field"] == "model", bad.text

        # A model the quality gate refuses: the activation fills and syncs it, then is refused with
        # the gate's numbers. Aborted, some documents deleted, staged again and forced in: the fill
        # deletes what the staged version still held of its first attempt.
        staged = http.post("/v1/collections/notes/rollout/stage", json={"model": str(noisy)})
        assert staged.status_code == 200, staged.text
        noisy_version = staged.json()["state"]["staged"]
        wait_ready(http, noisy_version)
        refused = http.post("/v1/collections/notes/rollout/activate",
                            json={"version": noisy_version, "queries": texts[:10]})
        assert refused.status_code == 409 and refused.json()["error"]["gate"]["passed"] is False, refused.text
        assert http.post("/v1/collections/notes/rollout/abort", json={"version": noisy_version}).status_code == 200
        gone = ["d-0", "d-1", "d-2"]
        assert http.post("/v1/collections/notes/documents/delete", json={"ids": gone}).status_code == 200
        for doc_id in gone:
            first[doc_id] = None
        assert http.post("/v1/collections/notes/rollout/stage", json={"model": str(noisy)}).status_code == 200
        wait_ready(http, noisy_version)
        forced = http.post("/v1/collections/notes/rollout/activate",
                           json={"version": noisy_version, "queries": texts[:10], "force": True})
        assert forced.status_code == 200 and forced.json()["state"]["active"] == noisy_version, forced.text
        for doc_id in ("d-0", "d-2", "d-3", "d-79"):
            expected = 404 if first[doc_id] is None else 200
            assert http.get(f"/v1/collections/notes/documents/{doc_id}").status_code == expected, doc_id
        # replicas hold two versions at most: a third is refused at once, naming why
        full = http.post("/v1/collections/notes/rollout/stage", json={"model": str(model)})
        assert full.status_code == 409 and "retire it first" in full.text, full.text
        minilm = forced.json()["state"]["previous"]
        assert http.post("/v1/collections/notes/rollout/retire", json={"version": minilm, "force": True}) \
            .status_code == 200

        with Traffic(cluster.gateway_url, "notes", texts) as traffic:
            time.sleep(1.0)
            staged = http.post("/v1/collections/notes/rollout/stage", json={"model": str(model)})
            assert staged.status_code == 200, staged.text
            state = staged.json()["state"]
            v1, v2 = state["active"], state["staged"]
            assert v2 and v2 != v1
            wait_ready(http, v2)
            time.sleep(1.0)  # writes land between the stage and the fill's cut
            # forced: the gate compares with the active version, the noisy model's (overlap ~0.3)
            activated = http.post("/v1/collections/notes/rollout/activate",
                                  json={"version": v2, "queries": texts[:10], "force": True})
            assert activated.status_code == 200, activated.text
            body = activated.json()
            assert body["state"]["active"] == v2, body
            assert [e["kind"] for e in body["state"]["events"]][-2:] == ["VersionSynced", "VersionActivated"]
            time.sleep(1.5)  # writes after the switch go to both versions
        assert not traffic.write_errors, traffic.write_errors[:5]
        assert not traffic.query_errors, traffic.query_errors[:5]
        assert traffic.queries > 20 and len(traffic.ledger) > 20

        expected = {**first, **traffic.ledger}
        for doc_id, text in sorted(expected.items()):
            got = http.get(f"/v1/collections/notes/documents/{doc_id}")
            if text is None:
                assert got.status_code == 404, (doc_id, got.text)
            else:
                assert got.status_code == 200 and got.json()["text"] == text, (doc_id, got.text)
        live = sum(text is not None for text in expected.values())
        shown = http.get("/v1/collections/notes").json()
        assert shown["active_version"] == v2 and shown["documents"] == live, shown
        # a written text is found by itself through the new version's encoder and vectors
        some = next(doc_id for doc_id, text in sorted(expected.items()) if text is not None and doc_id != "bare-note")
        hits = http.post("/v1/collections/notes/query", json={"text": expected[some], "k": 1}).json()["hits"]
        assert hits[0]["doc_id"] == some and hits[0].get("version", v2) == v2, hits
        dense = http.post("/v1/collections/notes/query", json={"text": bare_text, "k": 50}).json()["hits"]
        assert "bare-note" not in {h["doc_id"] for h in dense}
        listed = http.post("/v1/collections/notes/documents/scroll", json={
            "filter": {"must": [{"has_id": ["bare-note"]}]}, "with_vectors": True}).json()
        assert listed["version"] == v2 and [d["id"] for d in listed["documents"]] == ["bare-note"]
        assert "vector" not in listed["documents"][0]

        # the typed client and the CLI reach the same commands
        with ShardragClient(cluster.gateway_url, timeout_s=120) as client:
            notes = client.collection("notes")
            assert notes.rollout_status()["state"]["active"] == v2
            retired = notes.rollout("retire", v1, force=True)
        assert v1 not in retired["replicas"] and retired["state"]["previous"] is None, retired["state"]
        # the retired versions' files (bases and replica logs) go from every node; the active one's stay
        uid = http.get("/v1/collections/notes").json()["uid"]
        nodes_dir = root / "base" / "nodes"
        deadline = time.monotonic() + 30
        while True:
            held = {p.name for p in nodes_dir.glob(f"node-*/collections/{uid}/notes/**/") if p.is_dir()}
            if minilm not in held and v1 not in held:
                break
            assert time.monotonic() < deadline, f"retired versions still on disk: {held & {minilm, v1}}"
            time.sleep(0.5)
        assert v2 in held
        shown_by_cli = subprocess.run([sys.executable, "-m", "serving", "rollout", "status", "--collection", "notes",
                                       "--url", cluster.gateway_url], capture_output=True, text=True, timeout=60)
        assert shown_by_cli.returncode == 0 and f"active {v2}" in shown_by_cli.stdout, shown_by_cli

        # a node killed after the rollout comes back (the launcher restarts it) with its replicas on
        # the new version, caught up: every replica of a shard holds the same documents
        victim = cluster.nodes[0]
        pid = victim.process.pid
        os.kill(pid, signal.SIGKILL)
        deadline, digests = time.monotonic() + 120, {}
        while time.monotonic() < deadline:
            digests = {}
            for node in cluster.nodes:
                try:
                    hosted = httpx.get(f"{node.ready['url']}/v1/node", timeout=5).json()["replicas"]
                    for replica in (r for r in hosted if r["collection"] == "notes"):
                        info = httpx.get(f"{replica['url']}/v1/info", timeout=5).json()
                        held = sorted(v["id"] for v in info["versions"] if v["state"] == "ready")
                        digest = httpx.get(f"{replica['url']}/admin/digest", params={"version": v2}, timeout=5)
                        digests[replica["url"]] = (replica["shard"], tuple(held), digest.json().get("sha256"))
                except (httpx.HTTPError, TypeError, KeyError, ValueError):
                    continue
            per_shard = {shard: {d for s, _, d in digests.values() if s == shard} for shard in (0, 1)}
            if victim.process.pid != pid and len(digests) == 4 and \
                    all(held == (v2,) for _, held, _ in digests.values()) and \
                    all(len(d) == 1 and None not in d for d in per_shard.values()):
                break
            time.sleep(0.5)
        else:
            raise AssertionError(f"the restarted node's replicas did not come back on {v2}: {digests}")
        hits = http.post("/v1/collections/notes/query", json={"text": expected[some], "k": 1}).json()["hits"]
        assert hits[0]["doc_id"] == some
