"""Embedding versions as the gateway sees them: the registry with its immutable per-version
snapshots (``registry``), what each version looks like across the shards (``topology``), the
query encoders (made by ``serving.encoding``), the rollout commands (``rollout``), the quality gate
(``gate``) and where the rollout state is stored (``store``).

May import ``shardcall``, ``transport``, ``retrieval`` (and ``httpkit``); never ``gateway``,
``answer``, ``local`` or ``cli``.
"""
