"""The query encoder service: text → vectors for each loaded embedding version, off the gateway's
event loop.

- :mod:`settings` — ``encoder.*`` of the gateway config (backend, workers, batching, cache).
- :mod:`protocol` — the frames between the gateway and an encoder worker process.
- :mod:`worker` — an encoder worker process (``python -m serving.encoding.worker``): imports
  torch once, then loads each version's model on a side thread and encodes batches.
- :mod:`pool` — the gateway's encoder worker processes: spawned, restarted when one dies,
  batches sent to the least busy one.
- :mod:`backends` — one interface over the two ways to run an encoder: worker processes, or a
  thread of the gateway process.
- :mod:`cache` — the query-embedding LRU keyed by (version, text).
- :mod:`query_encoder` — what a version's queries call: cache → in-flight dedup → batcher → backend.
- :mod:`service` — makes each version's encoder on the configured backend; owns the workers and the cache.
"""
