"""One slice of the index: partitioning, FAISS build, on-disk layout + manifest, load/verify,
search, and the shard server process (``python -m index_shards serve``).

Imports ``retrieval`` only; never torch (a shard server starts in about a second and a half).
"""
