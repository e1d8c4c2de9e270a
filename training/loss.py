"""InfoNCE with in-batch negatives gathered across ranks.

Every rank gathers every rank's query and passage embeddings, puts its *own* tensors back in
its slot (the gathered copies carry no gradient; the local ones do — Tevatron's
``_dist_gather_tensor``), and computes the loss of the whole global batch. DDP averages
gradients over ranks, so the loss is multiplied by the world size: the result is exactly the
gradient of the single-process loss on the concatenated batch.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.nn import functional


def gather_with_grad(local: torch.Tensor) -> torch.Tensor:
    """All ranks' ``local`` tensors concatenated, rank order; gradient flows to this rank's part."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return local
    parts = [torch.empty_like(local) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, local.detach().contiguous())
    parts[dist.get_rank()] = local
    return torch.cat(parts, dim=0)


def info_nce(queries: torch.Tensor, passages: torch.Tensor, scale: torch.Tensor | float) -> torch.Tensor:
    """Mean cross-entropy of each query against every passage; query i's positive is passage i
    (passages beyond the queries' count are negatives only)."""
    logits = scale * queries @ passages.T
    labels = torch.arange(queries.shape[0], device=queries.device)
    return functional.cross_entropy(logits, labels)


def contrastive_loss(queries: torch.Tensor, passages: torch.Tensor, scale: torch.Tensor | float, *,
                     gather: bool, negatives: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(loss to back-propagate, the global-batch loss value for logging, global batch size).

    ``negatives``: extra passages (hard negatives), appended after every positive.
    """
    if not gather:
        candidates = passages if negatives is None else torch.cat([passages, negatives])
        loss = info_nce(queries, candidates, scale)
        return loss, loss.detach(), queries.shape[0]
    all_queries = gather_with_grad(queries)
    all_passages = gather_with_grad(passages)
    if negatives is not None:
        all_passages = torch.cat([all_passages, gather_with_grad(negatives)])
    loss = info_nce(all_queries, all_passages, scale)
    world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    return loss * world, loss.detach(), all_queries.shape[0]
