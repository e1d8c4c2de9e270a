"""One machine, many processes: the local cluster launcher (``launcher``) and the supervision of
its child processes (``child``), the chaos monkey and query accounting (``chaos``), and the
offline demo corpus (``demo_corpus``).

May import ``gateway`` (its config and cluster spec), ``versions`` (the rollout store),
``httpkit``, ``retrieval`` and ``index_shards`` (to find and launch shards); never ``cli``.
"""
