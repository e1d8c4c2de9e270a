"""The distributed KV cache of the generators: block keys and payload format (``blocks``), the
in-memory LRU pool (``pool``), the client that walks the local pool then the kv-nodes
(``client``), and the kv-node server (``node``) with its metrics.

May import ``httpkit`` and ``retrieval``; no other room of ``serving``.
"""
