"""One machine, many processes: the local cluster launcher (``launcher``), its node processes
(``nodes``: hosts of the collections created at run time and, in the nodes layout, of the
launched one), the answer path's kv-nodes and generators (``answer_path``), the supervision of
its child processes (``child``), the chaos monkey and query accounting (``chaos``), and the
offline demo corpus (``demo_corpus``).

Across hosts on one machine (issue 34): hosts as network namespaces with cuts between them
(``netns``), a real etcd on 127.0.0.1 or one member per host (``etcd``), a cluster whose every
process runs on a host of its own (``lab``), the seeded nemesis of partitions, kills and pauses
(``nemesis``), clients that record what they saw (``workload``) and the Jepsen-style checker of
that history (``history``).

May import ``gateway`` (its config and cluster spec), ``versions`` (the rollout store),
``httpkit``, ``retrieval`` and ``index_shards`` (to find and launch shards); never ``cli``.
"""
