"""Reading a gateway's Prometheus metrics in tests."""

from __future__ import annotations

import re

import httpx


def lexical_rounds(http: httpx.Client) -> tuple[float, float]:
    """The gateway's count of lexical and hybrid queries answered in one shard round, and in two
    (``shardrag_gateway_lexical_rounds_total``)."""
    metrics = http.get("/metrics").text
    found = [re.search(rf'^shardrag_gateway_lexical_rounds_total{{rounds="{n}"}} (\S+)$', metrics, re.MULTILINE)
             for n in (1, 2)]
    return float(found[0][1]) if found[0] else 0.0, float(found[1][1]) if found[1] else 0.0
