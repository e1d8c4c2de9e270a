"""The gateway: its HTTP API (``app``), the query path (``query``), the composition root that
builds a complete gateway (``factory``), the lexical and hybrid modes of a query
(``search_modes``: BM25 across the shards, or both legs fused), a query's ``group_by`` (``grouping``:
the k best groups of its ranking), its config (``config``: one settings dataclass per
component), API models, the OpenAPI query schema, the cluster view and Prometheus metrics; the
collections created at run time: their API (``collection_routes``; its create body:
``collection_models``), their rollouts (``collection_rollout``: re-embedding in place), their REST
tune (``collection_tune``), a stack per collection (``collections``) and tenant confinement
(``tenancy``).

May import every lower room of ``serving`` (answer, versions, shardcall, transport), ``httpkit``
and ``retrieval``; never ``local``, ``cli`` or ``index_shards``.
"""
