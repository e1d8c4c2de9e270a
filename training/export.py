"""The trained bi-encoder as a sentence-transformers checkpoint directory — a new embedding
version (its id has the sha256 of the new weights), ready for ``shardrag build --encoder`` and
``shardrag rollout``.

The base checkpoint's files are copied (tokenizer, pooling and module configs), its weights
overwritten by the trained transformer's; the BERT pooler, which mean pooling never uses, keeps
the base weights so the file loads without warnings. Written to a staging directory and renamed.
"""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

from retrieval.encoders import SentenceTransformerEncoder
from retrieval.types import EmbeddingVersion
from training.model import BiEncoder, resolve_model_dir


def export_encoder(model: BiEncoder, base_model: str, out: Path, name: str) -> EmbeddingVersion:
    from safetensors.torch import load_file, save_file

    base = resolve_model_dir(base_model)
    target = out / name
    staging = out / f".{name}.{uuid.uuid4().hex[:8]}"
    shutil.copytree(base, staging, ignore=shutil.ignore_patterns("*.safetensors", "*.bin", "*.pt", ".git*"))
    weights = load_file(str(base / "model.safetensors")) if (base / "model.safetensors").exists() else {}
    trained = {key: value.detach().cpu().contiguous() for key, value in model.transformer.state_dict().items()}
    weights.update(trained)
    save_file(weights, str(staging / "model.safetensors"), metadata={"format": "pt"})
    if target.exists():
        shutil.rmtree(target)
    staging.rename(target)
    return SentenceTransformerEncoder(target, name=name, device="cpu").version


def export_checkpoint(run_dir: Path, base_model: str, name: str, *, scale: float = 20.0,
                      learn_scale: bool = False) -> EmbeddingVersion:
    """Export the weights of the run's last checkpoint (what ``training.train`` exports at its end,
    redone from the checkpoint when a flow stopped between the two)."""
    from training.checkpoint import load_checkpoint

    checkpoint = load_checkpoint(run_dir)
    if checkpoint is None:
        raise FileNotFoundError(f"{run_dir} has no checkpoint to export")
    model = BiEncoder.from_checkpoint(base_model, scale=scale, learn_scale=learn_scale)
    model.load_state_dict(checkpoint["model"])
    return export_encoder(model, base_model, run_dir, name)
