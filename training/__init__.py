"""The retriever trainer (DDP, one rank per index slice) — arrives with issue 5.

Empty for now: the package exists so the distribution's layout and the import-direction
rules (training → retrieval, index_shards) are fixed from the start.
"""
