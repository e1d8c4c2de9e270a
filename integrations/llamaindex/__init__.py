"""LlamaIndex: ``ShardragVectorStore`` (``pip install 'shardrag[llamaindex]'``), a vector store for
``VectorStoreIndex`` — dense, hybrid and BM25 queries, metadata filters (``filters``: LlamaIndex's
operators in shardrag's filter language). Tested end to end through a real local cluster
(tests/integration/test_llamaindex_store.py)."""

from integrations.llamaindex.vectorstore import ShardragVectorStore

__all__ = ["ShardragVectorStore"]
