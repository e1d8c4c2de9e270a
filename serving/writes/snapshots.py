"""A shard's live documents at one seq, read from its primary (else any replica): what a staged
version is filled from (``staging``) and what a backup stores (``serving.gateway.backup_routes``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from retrieval.errors import ShardragError, ShardUnavailable
from retrieval.records import Snapshot

if TYPE_CHECKING:
    from serving.writes.service import WriteService


async def live_snapshot(writes: WriteService, shard: int, version: str) -> bytes:
    """``retrieval.records.Snapshot`` bytes of ``version`` on ``shard``, checked to decode."""
    errors = []
    for replica in writes.primary_first(shard):  # the same order reads use: the primary has every ack
        try:
            data = await writes.client.snapshot(replica, version, writes.settings.timeout_s)
            Snapshot.decode(data)
            return data
        except ShardragError as exc:
            errors.append(exc.message)
        except ValueError as exc:
            errors.append(f"{replica}: the snapshot does not parse: {exc}")
    raise ShardUnavailable(f"no replica of shard {shard} could send the documents of {version}: "
                           f"{'; '.join(errors)}", shard=shard)
