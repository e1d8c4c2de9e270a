"""Which replica is each shard's primary, as far as this gateway knows — never a truth of its own.

Every replica reports its role in ``/v1/info`` (term, primary, whether it is the primary), which
the version registry polls anyway; the primary of a shard is the replica that says it is, under
the highest term. A write that finds the answer out of date — the replica says ``not_primary``,
or cannot be reached — asks the shard's replicas again at once (:meth:`PrimaryDirectory.refresh`)
and retries until its deadline. So a gateway needs no call to the cluster state per write, and a
gateway that restarts knows nothing it could get wrong: it reads the replicas.
"""

from __future__ import annotations

import asyncio
import logging

from retrieval.contract import ReplicaInfo
from retrieval.errors import ShardragError
from serving.transport.client import ShardClient
from serving.versions.registry import VersionRegistry

logger = logging.getLogger(__name__)


def primary_of(infos: dict[str, ReplicaInfo | None]) -> tuple[str, int] | None:
    """(replica, term) of the replica that says it is the primary under the highest term."""
    best: tuple[str, int] | None = None
    for replica, info in infos.items():
        role = info.role if info is not None else None
        if role is not None and role.is_primary and (best is None or role.term > best[1]):
            best = (replica, role.term)
    return best


class PrimaryDirectory:
    def __init__(self, registry: VersionRegistry, client: ShardClient, *, probe_timeout_s: float = 1.0) -> None:
        self.registry = registry
        self.client = client
        self.probe_timeout_s = probe_timeout_s
        self._known: dict[int, tuple[str, int]] = {}  # shard → (primary, term), from the last look
        self._why_none: dict[int, str] = {}  # shard → why the last look found no primary
        self._locks: dict[int, asyncio.Lock] = {}

    def primary(self, shard: int) -> str | None:
        """The shard's primary as last seen (the registry's poll, or the last refresh)."""
        replicas = self.registry.shard_replicas[shard]
        polled = primary_of({r: self.registry.infos.get(r) for r in replicas})
        known = self._known.get(shard)
        if polled is not None and (known is None or polled[1] >= known[1]):
            self._known[shard] = polled
            return polled[0]
        return known[0] if known is not None else None

    async def refresh(self, shard: int, *, not_this: str | None = None) -> str | None:
        """Ask every replica of the shard for its role now; the primary found (None: none yet —
        an election is under way). ``not_this``: a replica that just said it is not the primary."""
        lock = self._locks.setdefault(shard, asyncio.Lock())
        async with lock:
            replicas = self.registry.shard_replicas[shard]

            async def info(replica: str) -> ReplicaInfo | None:
                try:
                    return await self.client.info(replica, self.probe_timeout_s)
                except ShardragError:
                    return None

            answers = dict(zip(replicas, await asyncio.gather(*(info(r) for r in replicas)), strict=True))
            found = primary_of({r: i for r, i in answers.items() if r != not_this})
            if found is None:
                self._known.pop(shard, None)
                self._why_none[shard] = why_no_primary(answers)
                return None
            if found != self._known.get(shard):
                logger.info("shard %d: primary %s (term %d)", shard, found[0], found[1])
            self._known[shard] = found
            return found[0]

    def why_none(self, shard: int) -> str:
        """What the last look at the shard found instead of a primary, for the error a write gives."""
        return self._why_none.get(shard, "no primary yet (an election is under way)")


def why_no_primary(answers: dict[str, ReplicaInfo | None]) -> str:
    """Why a shard has no primary, from its replicas' roles: an election under way, or one that
    cannot happen because no replica that holds every acknowledged write is answering."""
    roles = [info.role for info in answers.values() if info is not None and info.role is not None]
    if not roles:
        return "no replica of the shard answered"
    newest = max(roles, key=lambda role: role.term)
    answering = {role.replica for role in roles}
    if newest.term and newest.in_sync and not answering & set(newest.in_sync):
        return (f"no primary: only {', '.join(newest.in_sync)} hold every acknowledged write (term {newest.term}) "
                f"and none of them is answering ({', '.join(sorted(answering))} are); the shard takes writes again "
                "once one of them is back")
    return "no primary yet (an election is under way)"
