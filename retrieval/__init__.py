"""shardrag's light core: types, the shard contract's records (``contract``), the one error tree
(``errors``, with ``error_for_status``), what counts as a blank text (``blank``: the API schema's
pattern and the checks behind it), top-k merge, BM25's corpus statistics (``bm25``), the
lexical text analysis (``analysis``) and the fusion of ranked lists (``fusion``; what a query
naming no mode or fusion gets: ``query_defaults``), wire codec, the version protocol's pure state
machine (``rollout``), choosing a tuned search knob from measured answers (``tuning_choice``),
encoders (``bert_encoder``: BERT mean pooling on plain torch),
embedding cache, datasets, IR metrics, retrieval quality through a running gateway per search mode
and fusion weight (``search_quality``: ``shardrag eval --url``), crash-safe writes, the one reader
of ``SHARDRAG_*`` variables (``env``), the command-line runner, the Python client, its session
floors (``session``: a client reads its own writes) and its retries (``client_retry``), files cut
into passages (``passages``: Markdown, text, HTML, PDF, by the encoder's tokens), a collection's
backup on disk (``backup``: snapshots per shard, manifest, content digest), the metadata filter
language (``filters``) and the RFC 3339 instants its date-time ranges compare (``datetimes``).

May import the standard library and numpy; torch, httpx, PyStemmer, pypdf and transformers only
inside the leaf modules that need them (``encoders``, ``bert_encoder``, ``client``, ``client_retry``,
``analysis``, ``passages``),
lazily (``analysis`` reads bm25s's stop lists as data, never importing it). Never a web framework,
and none of shardrag's other packages: importing it must stay
cheap (no torch, FAISS or FastAPI). No server code: that is ``httpkit``'s.
"""

from retrieval.errors import ShardragError
from retrieval.merge import merge_topk
from retrieval.types import DocId, Document, EmbeddingVersion, Hit, Preprocessing, ShardId, ShardResult

__all__ = [
    "DocId",
    "Document",
    "EmbeddingVersion",
    "Hit",
    "Preprocessing",
    "ShardId",
    "ShardResult",
    "ShardragError",
    "merge_topk",
]
