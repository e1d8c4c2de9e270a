"""What must be one truth for every gateway and replica of a collection, as typed records over
the :class:`~clusterstate.kv.KV` seam. Keys, under ``/shardrag/<collection>/``::

    rollout                       RolloutState (retrieval.rollout): versions, the rollout step
    shards/<i>                    ShardRecord: primary term, primary, in-sync set, every replica
    shards/<i>/claim              {"replica", "term"}, on the primary's lease: its claim to order writes
    shards/<i>/members/<replica>  {"replica", ...}, on the replica's lease: it is alive
    gateways/<id>                 {"url", "generation"}, on the gateway's lease: alive, and the
                                  rollout generation it serves

Every change is a compare-and-swap on the key's revision (:meth:`ClusterState.update_shard`,
:meth:`ClusterState.update_rollout`), so two processes can never both record a transition from
the same state: two candidates cannot both become primary of a term, a primary that was replaced
cannot shrink the in-sync set of its successor.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import quote, unquote

from clusterstate.kv import KV, Entry
from retrieval.errors import ConfigError, CoordinatorUnavailable
from retrieval.rollout import RolloutState

CAS_ATTEMPTS = 20


@dataclass(slots=True, frozen=True)
class ShardRecord:
    """One shard's write ordering: who orders (``primary``) under which ``term``, and which
    replicas hold every acknowledged write (``in_sync``). ``replicas``: every replica that ever
    registered for the shard (the shard's members). ``revision``: the store revision it was read at."""

    term: int = 0
    primary: str | None = None
    in_sync: tuple[str, ...] = ()
    replicas: tuple[str, ...] = ()
    revision: int = 0

    def to_json(self) -> bytes:
        return json.dumps({"term": self.term, "primary": self.primary, "in_sync": sorted(self.in_sync),
                           "replicas": sorted(self.replicas)}).encode()

    @classmethod
    def from_entry(cls, entry: Entry | None) -> ShardRecord:
        if entry is None:
            return cls()
        data = json.loads(entry.value)
        return cls(int(data.get("term", 0)), data.get("primary"), tuple(data.get("in_sync", ())),
                   tuple(data.get("replicas", ())), entry.mod_revision)

    def to_dict(self) -> dict[str, Any]:
        return {"term": self.term, "primary": self.primary, "in_sync": sorted(self.in_sync),
                "replicas": sorted(self.replicas)}


@dataclass(slots=True, frozen=True)
class Claim:
    """A primary's claim on its shard, alive while its lease is."""

    replica: str
    term: int


class ClusterState:
    def __init__(self, kv: KV, collection: str) -> None:
        if not collection or "/" in collection:
            raise ConfigError(f"invalid collection name {collection!r}", field="collection")
        self.kv = kv
        self.collection = collection
        self.root = f"/shardrag/{collection}/"

    def __repr__(self) -> str:
        return f"ClusterState({self.kv!r}, {self.collection!r})"

    # -- keys ---------------------------------------------------------------------------------
    def _shard_key(self, shard_id: int) -> str:
        return f"{self.root}shards/{shard_id}"

    def revision(self) -> int:
        return self.kv.revision()

    # -- shards -------------------------------------------------------------------------------
    def shard(self, shard_id: int) -> ShardRecord:
        return ShardRecord.from_entry(self.kv.get(self._shard_key(shard_id)))

    def update_shard(self, shard_id: int, change: Callable[[ShardRecord], ShardRecord | None]) -> ShardRecord | None:
        """Apply ``change`` to the shard's record with compare-and-swap, retried on a race. ``change``
        returns the new record, the same record (nothing to do), or None (refuse: nothing written);
        returns what is stored afterwards, or None when ``change`` refused."""
        key = self._shard_key(shard_id)
        for _ in range(CAS_ATTEMPTS):
            current = self.shard(shard_id)
            new = change(current)
            if new is None:
                return None
            if replace(new, revision=current.revision) == current:
                return current
            revision = self.kv.put(key, new.to_json(), expect_revision=current.revision)
            if revision is not None:
                return replace(new, revision=revision)
        raise CoordinatorUnavailable(f"shard {shard_id}: the cluster state kept changing under a compare-and-swap",
                                     shard=shard_id)

    def shard_state(self, shard_id: int) -> tuple[ShardRecord, Claim | None, dict[str, dict[str, Any]]]:
        """The shard's record, its primary's live claim and its live members, in one read (what a
        replica's role looks at every tick)."""
        key = self._shard_key(shard_id)
        record, claim, members = ShardRecord(), None, {}
        for entry in self.kv.prefix(key):
            rest = entry.key[len(key):]
            if rest == "":
                record = ShardRecord.from_entry(entry)
            elif rest == "/claim":
                data = json.loads(entry.value)
                claim = Claim(str(data["replica"]), int(data["term"]))
            elif rest.startswith("/members/"):
                members[unquote(rest[len("/members/"):])] = json.loads(entry.value)
        return record, claim, members

    def claim(self, shard_id: int) -> Claim | None:
        entry = self.kv.get(self._shard_key(shard_id) + "/claim")
        if entry is None:
            return None
        data = json.loads(entry.value)
        return Claim(str(data["replica"]), int(data["term"]))

    def put_claim(self, shard_id: int, claim: Claim, lease: int) -> bool:
        """Claim the shard for ``claim.replica`` (only when no live claim exists). A claim always
        hangs on a lease: one without would outlive its holder."""
        if lease <= 0:
            raise CoordinatorUnavailable("no live lease to hang the primary's claim on (it is being renewed)",
                                         field="lease")
        value = json.dumps({"replica": claim.replica, "term": claim.term}).encode()
        return self.kv.put(self._shard_key(shard_id) + "/claim", value, expect_revision=0, lease=lease) is not None

    def refresh_claim(self, shard_id: int, claim: Claim, lease: int) -> bool:
        """Re-attach our claim to a new lease (ours lapsed but nobody took over): only if the
        shard's term is still ``claim.term``."""
        if self.claim(shard_id) is not None:
            return self.claim(shard_id) == claim
        if self.shard(shard_id).term != claim.term:
            return False
        return self.put_claim(shard_id, claim, lease)

    def drop_claim(self, shard_id: int, claim: Claim) -> None:
        entry = self.kv.get(self._shard_key(shard_id) + "/claim")
        if entry is not None and json.loads(entry.value) == {"replica": claim.replica, "term": claim.term}:
            self.kv.delete(entry.key, expect_revision=entry.mod_revision)

    def register_member(self, shard_id: int, replica: str, lease: int, details: Mapping[str, Any]) -> None:
        key = f"{self._shard_key(shard_id)}/members/{quote(replica, safe='')}"
        self.kv.put(key, json.dumps({"replica": replica, **details}).encode(), lease=lease)

    def unregister_member(self, shard_id: int, replica: str) -> None:
        """A replica leaving while its lease lives on (a node's shared lease): its member key goes now."""
        self.kv.delete(f"{self._shard_key(shard_id)}/members/{quote(replica, safe='')}")

    def members(self, shard_id: int) -> dict[str, dict[str, Any]]:
        """Live replicas of the shard (their lease holds) → what they registered."""
        prefix = f"{self._shard_key(shard_id)}/members/"
        return {unquote(e.key[len(prefix):]): json.loads(e.value) for e in self.kv.prefix(prefix)}

    def shards(self) -> dict[int, ShardRecord]:
        prefix = f"{self.root}shards/"
        found = {}
        for entry in self.kv.prefix(prefix):
            rest = entry.key[len(prefix):]
            if rest.isdigit():
                found[int(rest)] = ShardRecord.from_entry(entry)
        return found

    # -- rollout ------------------------------------------------------------------------------
    def rollout_entry(self) -> tuple[RolloutState | None, int]:
        entry = self.kv.get(self.root + "rollout")
        if entry is None:
            return None, 0
        return RolloutState.from_dict(json.loads(entry.value)), entry.mod_revision

    def rollout(self) -> RolloutState | None:
        return self.rollout_entry()[0]

    def update_rollout(self, change: Callable[[RolloutState | None], RolloutState]) -> RolloutState:
        """Apply ``change`` with compare-and-swap (retried on a race); it may raise (nothing is
        written) or return the state unchanged (nothing is written either)."""
        for _ in range(CAS_ATTEMPTS):
            current, revision = self.rollout_entry()
            new = change(current)
            if new is current or new == current:
                return new
            body = json.dumps(new.to_dict(), indent=1).encode()
            if self.kv.put(self.root + "rollout", body, expect_revision=revision) is not None:
                return new
        raise CoordinatorUnavailable("the rollout state kept changing under a compare-and-swap", field="rollout")

    # -- gateways -----------------------------------------------------------------------------
    def register_gateway(self, gateway_id: str, lease: int, url: str, generation: int) -> None:
        self.kv.put(f"{self.root}gateways/{gateway_id}", json.dumps({"url": url, "generation": generation}).encode(),
                    lease=lease)

    def gateways(self) -> dict[str, dict[str, Any]]:
        """Live gateways → {"url", "generation"}."""
        prefix = f"{self.root}gateways/"
        return {e.key[len(prefix):]: json.loads(e.value) for e in self.kv.prefix(prefix)}

    def snapshot(self) -> dict[str, Any]:
        """Everything under the collection, for ``/v1/cluster`` and debugging."""
        state = self.rollout()
        shards = {str(i): {**record.to_dict(), "claim": _claim_dict(self.claim(i)),
                           "members": sorted(self.members(i))} for i, record in sorted(self.shards().items())}
        return {"rollout": state.to_dict() if state else None, "shards": shards, "gateways": self.gateways()}


def _claim_dict(claim: Claim | None) -> dict[str, Any] | None:
    return {"replica": claim.replica, "term": claim.term} if claim else None


class RolloutStoreOnKV:
    """The gateway's rollout store (``serving.versions.store.RolloutStore``) in the cluster state."""

    def __init__(self, state: ClusterState) -> None:
        self.state = state

    def load(self) -> RolloutState | None:
        return self.state.rollout()

    def update(self, change: Callable[[RolloutState | None], RolloutState]) -> RolloutState:
        return self.state.update_rollout(change)
