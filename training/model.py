"""The bi-encoder: one transformer for queries and passages, mean pooling over tokens,
L2-normalised — the all-MiniLM-L6-v2 recipe, so the trained weights drop back into a
sentence-transformers checkpoint. The BERT pooler is not built (it would be an unused
parameter under DDP)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from retrieval.encoders import default_model_dir


def resolve_model_dir(model: str) -> Path:
    return default_model_dir() if model in ("default", "", None) else Path(model)


class BiEncoder(nn.Module):
    def __init__(self, transformer: nn.Module, tokenizer: Any, *, scale: float = 20.0, learn_scale: bool = False,
                 max_length: int = 128) -> None:
        super().__init__()
        self.transformer = transformer
        self.tokenizer = tokenizer
        self.max_length = max_length
        log_scale = torch.tensor(float(scale)).log()
        if learn_scale:
            self.log_scale = nn.Parameter(log_scale)
        else:
            self.register_buffer("log_scale", log_scale)

    @classmethod
    def from_checkpoint(cls, model: str, **kwargs: Any) -> BiEncoder:
        from transformers import AutoModel, AutoTokenizer

        directory = resolve_model_dir(model)
        transformer = AutoModel.from_pretrained(str(directory), add_pooling_layer=False)
        tokenizer = AutoTokenizer.from_pretrained(str(directory))
        return cls(transformer, tokenizer, **kwargs)

    @property
    def scale(self) -> torch.Tensor:
        return self.log_scale.exp()

    def tokenize(self, texts: Sequence[str], device: torch.device | str) -> dict[str, torch.Tensor]:
        batch = self.tokenizer(list(texts), padding=True, truncation=True, max_length=self.max_length,
                               return_tensors="pt")
        return {key: value.to(device) for key, value in batch.items()}

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, **extra: torch.Tensor) -> torch.Tensor:
        hidden = self.transformer(input_ids=input_ids, attention_mask=attention_mask, **extra).last_hidden_state
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
        return nn.functional.normalize(pooled.float(), dim=-1)


def make_tiny_checkpoint(target: Path, *, hidden: int = 32, layers: int = 2, seed: int = 0) -> Path:
    """A randomly initialised small BERT with MiniLM's tokenizer, saved as a sentence-transformers
    checkpoint directory (for tests and quick runs: the real code path at a fraction of the cost)."""
    from safetensors.torch import save_file
    from transformers import BertConfig, BertModel

    base = default_model_dir()
    target.mkdir(parents=True, exist_ok=True)
    config = BertConfig(vocab_size=30522, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=2,
                        intermediate_size=hidden * 2, max_position_embeddings=512)
    torch.manual_seed(seed)
    model = BertModel(config)
    config.save_pretrained(str(target))
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(target / "model.safetensors"),
              metadata={"format": "pt"})
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json", "modules.json",
                 "sentence_bert_config.json", "config_sentence_transformers.json"):
        if (base / name).exists():
            shutil.copy2(base / name, target / name)
    pooling = json.loads((base / "1_Pooling" / "config.json").read_text())
    pooling["word_embedding_dimension"] = hidden
    (target / "1_Pooling").mkdir(exist_ok=True)
    (target / "1_Pooling" / "config.json").write_text(json.dumps(pooling, indent=2))
    return target


@torch.no_grad()
def encode_texts(model: BiEncoder, texts: Sequence[str], device: torch.device, *, batch_size: int = 64) -> np.ndarray:
    """Embeddings of ``texts`` with the model's current weights (eval mode, no gradient; bf16
    autocast on GPUs that have it), as float32 numpy rows."""
    was_training = model.training
    model.eval()
    try:
        chunks = []
        for start in range(0, len(texts), batch_size):
            tokens = model.tokenize(texts[start:start + batch_size], device)
            with torch.autocast(device.type, dtype=torch.bfloat16,
                                enabled=device.type == "cuda" and torch.cuda.is_bf16_supported()):
                chunks.append(model(**tokens).float().cpu().numpy())
        return np.ascontiguousarray(np.concatenate(chunks), dtype=np.float32)
    finally:
        model.train(was_training)
