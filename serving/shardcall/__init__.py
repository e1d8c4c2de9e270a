"""Calls to the shards: fan a query out and merge the exact top k (``fanout``), make one call to
one shard — replica choice, hedging, retries, deadline (``call``) — with the policies it uses:
balancers (``balancer``, ``p2c_peak_ewma``, the registry in ``policies``), adaptive hedge delay
and budget (``hedging``), outlier ejection and probes (``ejection``), natural batching
(``batching``), and the lexical leg's fan-out (``lexical``: each shard's BM25 top k under the
collection's statistics as last summed, checked against the statistics every shard returns and
asked again when they differ — the unsharded ranking).

May import ``transport`` (the ShardClient seam) and ``retrieval``; no other room of ``serving``.
"""
