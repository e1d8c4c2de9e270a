"""Gathered in-batch negatives across 2 real gloo processes give the single-process loss on the
concatenated batch, and (after DDP's averaging) its exact gradient."""


import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from training.loss import contrastive_loss, info_nce

WORLD, BATCH, DIM = 2, 4, 8


def embeddings(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    queries = torch.nn.functional.normalize(torch.randn(WORLD * BATCH, DIM, generator=generator), dim=-1)
    passages = torch.nn.functional.normalize(torch.randn(WORLD * BATCH, DIM, generator=generator), dim=-1)
    return queries, passages


def worker(rank: int, store_path: str, results) -> None:
    # a file store: the ranks meet through a file, no port to pick
    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=WORLD)
    queries, passages = embeddings(0)
    local_q = queries[rank * BATCH:(rank + 1) * BATCH].clone().requires_grad_(True)
    local_p = passages[rank * BATCH:(rank + 1) * BATCH].clone().requires_grad_(True)
    loss, value, global_batch = contrastive_loss(local_q, local_p, 20.0, gather=True)
    loss.backward()
    # DDP would average the parameter gradients over ranks: do the same to the embedding grads
    results[rank] = (float(value), global_batch, (local_q.grad / WORLD).tolist(), (local_p.grad / WORLD).tolist())
    dist.destroy_process_group()


def test_gathered_loss_and_gradient_equal_the_single_process_ones(tmp_path):
    results = mp.Manager().dict()
    mp.spawn(worker, args=(str(tmp_path / "store"), results), nprocs=WORLD, join=True)
    queries, passages = embeddings(0)
    queries.requires_grad_(True)
    passages.requires_grad_(True)
    expected = info_nce(queries, passages, 20.0)
    expected.backward()
    for rank in range(WORLD):
        value, global_batch, q_grad, p_grad = results[rank]
        assert global_batch == WORLD * BATCH  # negatives have the global batch shape
        assert abs(value - float(expected.detach())) < 1e-6
        rows = slice(rank * BATCH, (rank + 1) * BATCH)
        # after averaging, each rank holds exactly the single-process gradient of its own rows
        assert torch.allclose(torch.tensor(q_grad), queries.grad[rows], atol=1e-6)
        assert torch.allclose(torch.tensor(p_grad), passages.grad[rows], atol=1e-6)


def test_local_only_negatives_use_the_local_batch():
    queries, passages = embeddings(1)
    loss, value, global_batch = contrastive_loss(queries[:BATCH], passages[:BATCH], 20.0, gather=False)
    assert global_batch == BATCH and torch.isclose(loss, info_nce(queries[:BATCH], passages[:BATCH], 20.0))


def test_hard_negatives_join_the_candidates_but_never_as_positives():
    queries, passages = embeddings(2)
    negatives = passages.flip(0)
    loss, _, _ = contrastive_loss(queries, passages, 20.0, gather=False, negatives=negatives)
    logits = 20.0 * queries @ torch.cat([passages, negatives]).T
    expected = torch.nn.functional.cross_entropy(logits, torch.arange(len(queries)))
    assert torch.isclose(loss, expected)
    assert loss > info_nce(queries, passages, 20.0)  # more negatives: a harder task
