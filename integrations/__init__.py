"""Framework integrations: shardrag where RAG users already are (docs/integrations.md).

| module | what | extra |
|---|---|---|
| ``common`` | a collection as an integration reaches it, making it, vectors per metric | |
| ``lists`` | lists longer than one filter condition holds: any number of ids or values; reads by id | |
| ``langchain`` | ``ShardragVectorStore``: LangChain's ``VectorStore`` (``filters``: ``$eq``, …) | ``langchain`` |
| ``llamaindex`` | ``ShardragVectorStore``: a LlamaIndex vector store (``filters``: its operators) | ``llamaindex`` |
| ``haystack`` | ``ShardragDocumentStore`` and its retrievers (``filters``: Haystack's syntax) | ``haystack`` |

Imports point one way: an integration uses ``retrieval`` (its clients, errors, session floors) and
its framework; nothing in shardrag imports an integration (the import contracts say so).
"""
