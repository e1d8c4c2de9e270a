"""shardrag's light core: types, errors, top-k merge, wire codec, encoders, datasets, IR metrics.

Importing this package must stay cheap: it pulls in neither torch, FAISS nor FastAPI.
The leaf modules that need heavy libraries (``encoders``, ``client``) import them lazily.
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
