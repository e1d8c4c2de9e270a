"""One slice of the index: partitioning, FAISS build, on-disk layout + manifest, load/verify,
the version store of a replica (``versions``), search, tuning a search knob (``tuning`` on a
shard's files, ``live_tuning`` on a running replica's base), fault injection, the shard server
process (``python -m index_shards serve``), the node that hosts replicas of any collection
placed on it at run time (``node``, ``python -m index_shards node``) and its share of the launched
collection (``placement``: replica r of shard i on node (i + r) mod N), the flags both processes
share (``server_flags``), the lexical leg (``lexical``: the inverted index of a base and of a
segment; ``lexical_search``: a shard's BM25 top k under the collection's statistics, with its
own; ``lexical_warm``: when a replica builds a base's index — ahead of the queries once it has
served a lexical one; ``hybrid_search``: a weighted hybrid's exact fused top k of the shard's documents;
``hybrid_sealed``: the same for a batch in whole-batch passes, on a shard with no writes since
its base), filtered search (``payload``: the metadata columns; ``selection``: a filter's
documents by id, by storage position or by IVF list; ``filtered``: the planner; ``regions``: an
HNSW base's k-means regions, for filters that run against the query), and corpora and filters
grown from real embeddings for tests and benchmarks at sizes the shipped data does not reach
(``synthetic``).

May import ``retrieval`` and ``httpkit`` (the server); never ``serving`` or ``training``, and never
torch (a shard server starts in about a second and a half).
"""
