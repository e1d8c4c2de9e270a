"""The retriever trainer: DDP with one rank per index slice, the result shipped as a new
embedding version.

    data.py        slice-aware training pairs (given pairs routed to the owning rank, or
                   self-supervised pairs made from the slice), deterministic from (seed, rank, step)
    model.py       bi-encoder: a sentence-transformers checkpoint (mean pooling, normalised)
    loss.py        InfoNCE with in-batch negatives gathered across ranks (gradient through the local part)
    checkpoint.py  atomic checkpoints: model, optimizer, scheduler, RNG states, step
    train.py       the DDP loop (`python -m training.train`, what torchrun runs)
    export.py      the trained model as a sentence-transformers dir = a new embedding version
    launch.py      local torchrun and Ray Train launchers
    evaluate.py    nDCG/recall/MRR through the sharded index, base vs trained

May import ``retrieval`` and ``index_shards``; never ``httpkit`` or ``serving`` (the trainer talks to a
gateway over HTTP only). torch is imported by the modules that need it.
"""
