"""LangChain: ``ShardragVectorStore`` (``pip install 'shardrag[langchain]'``), checked by
``langchain-tests``' ``VectorStoreIntegrationTests`` against a real local cluster
(tests/integration/test_langchain_store.py)."""

from integrations.langchain.vectorstore import ShardragVectorStore

__all__ = ["ShardragVectorStore"]
