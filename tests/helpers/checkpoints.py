"""Real alternative encoder versions for rollout tests: a copy of MiniLM with its weights
perturbed by seeded noise (a different sha256, so a different embedding version)."""

from __future__ import annotations

import shutil
from pathlib import Path


def perturbed_checkpoint(source: Path, target: Path, *, seed: int, scale: float) -> Path:
    import torch
    from safetensors.torch import load_file, save_file

    if (target / "model.safetensors").exists():
        return target
    shutil.copytree(source, target, dirs_exist_ok=True)
    tensors = load_file(str(source / "model.safetensors"))
    generator = torch.Generator().manual_seed(seed)
    for name, tensor in tensors.items():
        if tensor.is_floating_point() and tensor.numel() > 1:
            noise = torch.randn(tensor.shape, generator=generator, dtype=tensor.dtype)
            tensors[name] = (tensor + scale * tensor.std() * noise).contiguous()
    save_file(tensors, str(target / "model.safetensors"), metadata={"format": "pt"})
    return target
