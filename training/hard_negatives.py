"""Hard negatives mined from the live index through the gateway.

For each training query the gateway's top hits are fetched (the index as it is served now) and
the best-ranked passage that is not the query's positive — nor any positive of the same batch,
which would already be a negative — becomes an extra negative passage in the batch. Mined
negatives are cached and the cache is dropped every ``refresh_every`` steps, so they follow the
index (e.g. after a rollout) without a query per pair per step. A gateway that cannot be
reached costs the batch its hard negatives, never the run.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from retrieval.errors import ShardragError
from training.data import Pair

logger = logging.getLogger(__name__)


class HardNegativeMiner:
    def __init__(self, url: str, *, refresh_every: int = 50, depth: int = 5, timeout_s: float = 10.0) -> None:
        from retrieval.client import ShardragClient

        self._client = ShardragClient(url, timeout_s=timeout_s)
        self.refresh_every = refresh_every
        self.depth = depth
        self._cache: dict[str, list[tuple[str, str]]] = {}  # query → [(doc id, passage)], best first
        self._epoch = -1
        self.mined = 0
        self.failures = 0

    def negatives(self, step: int, batch: Sequence[Pair]) -> list[str | None]:
        """One hard negative passage per pair (None where none could be found)."""
        epoch = step // self.refresh_every
        if epoch != self._epoch:
            self._cache.clear()
            self._epoch = epoch
        positives = {pair.doc_id for pair in batch}
        out: list[str | None] = []
        for pair in batch:
            hits = self._cache.get(pair.query)
            if hits is None:
                try:
                    response = self._client.query(text=pair.query, k=self.depth)
                    hits = [(h["doc_id"], f"{h['title']} {h['text']}" if h["title"] else h["text"])
                            for h in response["hits"]]
                except ShardragError as exc:
                    self.failures += 1
                    logger.warning("hard negatives: gateway query failed (%s)", exc.message)
                    hits = []
                self._cache[pair.query] = hits
            choice = next((passage for doc_id, passage in hits if doc_id not in positives), None)
            self.mined += choice is not None
            out.append(choice)
        return out

    def close(self) -> None:
        self._client.close()
