"""Calls to the shards: fan a query out and merge the exact top k (``fanout``), make one call to
one shard — replica choice, hedging, retries, deadline (``call``) — with the policies it uses:
balancers (``balancer``, ``p2c_peak_ewma``, the registry in ``policies``), adaptive hedge delay
and budget (``hedging``), outlier ejection and probes (``ejection``), natural batching
(``batching``), and the lexical leg's two-phase fan-out (``lexical``: the shards' BM25 statistics
summed, then each shard's top k under the sum — the unsharded ranking).

May import ``transport`` (the ShardClient seam) and ``retrieval``; no other room of ``serving``.
"""
