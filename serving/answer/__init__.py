"""RAG answers: the answer service behind ``POST /v1/answer`` (``service``: retrieve through an
injected function, pick a generator, stream), the prompt layout (``prompt``), the generator with
its KV-cache reuse (``generator``), the generator worker process (``worker``) and its metrics.

May import ``kvcache``, ``httpkit`` and ``retrieval``; never ``gateway``, ``versions``,
``local`` or ``cli``.
"""
