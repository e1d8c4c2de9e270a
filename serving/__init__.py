"""The gateway and everything around it: transport seam to the shards, replica balancer,
request coalescing, fan-out + merge, the local cluster launcher and the ``shardrag`` CLI.

Imports ``retrieval``; ``index_shards`` only in ``embedded`` (in-process transport) and
``launcher``/``cli`` (building and starting shards).
"""
