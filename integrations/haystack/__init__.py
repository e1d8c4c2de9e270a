"""Haystack: ``ShardragDocumentStore`` (a ``DocumentStore``) and its retrievers.

| module | what |
|---|---|
| ``document_store`` | documents in a collection: write policies, filters, counts, deletes |
| ``async_methods`` | the store's ``*_async`` twins |
| ``store_base`` | what the sync and async methods share (settings, documents, policies), no I/O |
| ``filters`` | Haystack's filter syntax as shardrag's filter language |
| ``retrievers`` | ``ShardragEmbeddingRetriever`` (dense), ``ShardragBM25Retriever`` (BM25), hybrid |
"""

from integrations.haystack.document_store import ShardragDocumentStore
from integrations.haystack.retrievers import (
    ShardragBM25Retriever,
    ShardragEmbeddingRetriever,
    ShardragHybridRetriever,
)

__all__ = ["ShardragBM25Retriever", "ShardragDocumentStore", "ShardragEmbeddingRetriever", "ShardragHybridRetriever"]
