"""A BERT mean-pooling checkpoint run on plain torch: the same vectors as sentence-transformers, without it.

Importing sentence-transformers costs 4-6 s of CPU (it pulls transformers, scikit-learn, scipy and
pandas) against torch's ~1 s, and every gateway's encoder worker paid it at start. For the
checkpoints that are a BERT encoder, mean pooling and an optional L2 normalisation
(all-MiniLM-L6-v2 and what ``training/`` exports from it) this module reproduces
sentence-transformers' inference op for op: the fast tokenizer from ``tokenizer.json``, the same
length-sorted batches, the embeddings, the SDPA attention with the same boolean mask, GELU,
LayerNorm, the masked mean and the two normalisations. The vectors are bit-identical to
``SentenceTransformer.encode`` on CPU (``tests/unit/retrieval/test_bert_encoder.py`` compares
them on the shared data). Anything else — other architectures, pooling modes, CUDA — stays on
sentence-transformers (:func:`lean_checkpoint` says why not).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import torch

_MODULES = ("sentence_transformers.models.Transformer", "sentence_transformers.models.Pooling",
            "sentence_transformers.models.Normalize")


def _json(path: Path) -> dict[str, Any] | list[Any] | None:
    try:
        loaded: dict[str, Any] | list[Any] = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return loaded


def lean_checkpoint(model_dir: Path) -> str | None:
    """None when ``model_dir`` can run on :class:`LeanBert`, else the reason it cannot."""
    modules = _json(model_dir / "modules.json")
    if not isinstance(modules, list) or not modules:
        return "no modules.json"
    types = [str(m.get("type", "")) for m in modules if isinstance(m, dict)]
    if types not in (list(_MODULES), list(_MODULES[:2])):
        return f"modules {types} are not Transformer, Pooling[, Normalize]"
    if modules[0].get("path", "") != "":
        return "the transformer is not at the checkpoint's root"
    pooling = _json(model_dir / str(modules[1].get("path", "")) / "config.json")
    if not isinstance(pooling, dict):
        return "no pooling config"
    modes = {key for key, value in pooling.items() if key.startswith("pooling_mode") and value}
    mean_only = modes == {"pooling_mode_mean_tokens"} or (pooling.get("pooling_mode") == "mean" and len(modes) <= 1)
    if not mean_only or pooling.get("include_prompt", True) is not True:
        return f"pooling {pooling} is not a plain mean"
    config = _json(model_dir / "config.json")
    if not isinstance(config, dict) or config.get("model_type") != "bert":
        return "not a BERT model"
    if (config.get("position_embedding_type", "absolute") != "absolute" or config.get("hidden_act") != "gelu"
            or config.get("is_decoder") or config.get("add_cross_attention")):
        return "a BERT variant (position embeddings, activation or decoder) this module does not run"
    st_config = _json(model_dir / "sentence_bert_config.json")
    if isinstance(st_config, dict) and st_config.get("do_lower_case"):
        return "sentence_bert_config lowercases"
    weights = model_dir / "model.safetensors"
    if not weights.exists() or not (model_dir / "tokenizer.json").exists():
        return "no model.safetensors or tokenizer.json"
    dtypes = _weight_dtypes(weights)
    if dtypes is None or not dtypes <= {"F32", "I64"}:
        return f"weights stored as {sorted(dtypes or ['unreadable'])}, not float32"
    return None


def _weight_dtypes(path: Path) -> set[str] | None:
    """The tensor dtypes a safetensors file declares in its header (8-byte length, then JSON):
    transformers runs a checkpoint in the dtype it was stored in, this module only in float32."""
    try:
        with path.open("rb") as handle:
            size = int.from_bytes(handle.read(8), "little")
            header = json.loads(handle.read(size)) if 0 < size < 1 << 26 else None
    except (OSError, ValueError):
        return None
    if not isinstance(header, dict):
        return None
    return {str(entry.get("dtype")) for key, entry in header.items()
            if key != "__metadata__" and isinstance(entry, dict)}


class LeanBert:
    """``encode(texts, batch_size, normalize_embeddings)`` → float32 (n, dim), CPU only."""

    def __init__(self, model_dir: Path, *, max_seq_length: int) -> None:
        import torch
        from safetensors.torch import load_file
        from tokenizers import Tokenizer

        config = _json(model_dir / "config.json")
        assert isinstance(config, dict)
        self._heads = int(config["num_attention_heads"])
        self._layers = int(config["num_hidden_layers"])
        self._eps = float(config.get("layer_norm_eps", 1e-12))
        self.dim = int(config["hidden_size"])
        self._normalize_module = len(_json(model_dir / "modules.json") or []) == 3
        raw = load_file(str(model_dir / "model.safetensors"))
        prefix = "bert." if "bert.embeddings.word_embeddings.weight" in raw else ""
        self._w = {key[len(prefix):]: value.to(torch.float32) for key, value in raw.items() if key.startswith(prefix)}
        # sentence-transformers caps the tokenizer at the model's positions, then at max_seq_length.
        limit = min(max_seq_length, int(config.get("max_position_embeddings", max_seq_length)))
        self._tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        self._tokenizer.enable_truncation(max_length=limit, strategy="longest_first")
        pad_id = int(config.get("pad_token_id", 0) or 0)
        self._tokenizer.enable_padding(direction="right", pad_id=pad_id, pad_type_id=0,
                                       pad_token=self._tokenizer.id_to_token(pad_id) or "[PAD]")

    def _layer_norm(self, x: torch.Tensor, name: str) -> torch.Tensor:
        import torch.nn.functional as F

        return F.layer_norm(x, (self.dim,), self._w[f"{name}.weight"], self._w[f"{name}.bias"], self._eps)

    def _linear(self, x: torch.Tensor, name: str) -> torch.Tensor:
        import torch.nn.functional as F

        return F.linear(x, self._w[f"{name}.weight"], self._w[f"{name}.bias"])

    def _forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        import torch
        import torch.nn.functional as F

        batch, length = ids.shape
        w = self._w
        # transformers' order: (word + token type 0) + position, then LayerNorm.
        hidden = F.embedding(ids, w["embeddings.word_embeddings.weight"])
        hidden = hidden + F.embedding(torch.zeros_like(ids), w["embeddings.token_type_embeddings.weight"])
        hidden = hidden + F.embedding(torch.arange(length).unsqueeze(0), w["embeddings.position_embeddings.weight"])
        hidden = self._layer_norm(hidden, "embeddings.LayerNorm")
        # transformers passes no mask when nothing is padded, else a materialised (b, 1, q, k) bool mask.
        attn_mask = None if bool(mask.all()) else mask.bool()[:, None, None, :].expand(batch, 1, length, length).clone()
        head = self.dim // self._heads
        for index in range(self._layers):
            name = f"encoder.layer.{index}"
            q, k, v = (self._linear(hidden, f"{name}.attention.self.{part}").view(batch, length, -1, head)
                       .transpose(1, 2) for part in ("query", "key", "value"))
            context = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=0.0, scale=head ** -0.5,
                                                     is_causal=False)
            context = context.reshape(batch, -1, length, head).transpose(1, 2).contiguous()
            context = context.reshape(batch, length, -1).contiguous()
            attended = self._layer_norm(self._linear(context, f"{name}.attention.output.dense") + hidden,
                                        f"{name}.attention.output.LayerNorm")
            inner = F.gelu(self._linear(attended, f"{name}.intermediate.dense"))
            hidden = self._layer_norm(self._linear(inner, f"{name}.output.dense") + attended,
                                      f"{name}.output.LayerNorm")
        weights = mask.unsqueeze(-1).to(torch.float32)
        summed = (hidden * weights).sum(dim=1, dtype=torch.float32)
        pooled = summed / torch.clamp(weights.sum(dim=1, dtype=torch.float32), min=1e-9)
        return F.normalize(pooled, p=2, dim=-1) if self._normalize_module else pooled

    def encode(self, texts: Sequence[str], *, batch_size: int, normalize_embeddings: bool,
               show_progress_bar: bool = False) -> np.ndarray:
        import torch
        import torch.nn.functional as F

        # sentence-transformers' batches: longest text (in characters) first, np.argsort's default sort.
        order = np.argsort([-len(text) for text in texts])
        vectors: list[torch.Tensor] = []
        starts: Iterable[int] = range(0, len(texts), batch_size)
        if show_progress_bar:
            from tqdm.auto import tqdm

            starts = tqdm(starts, desc="Batches")
        with torch.inference_mode():
            for start in starts:
                encodings = self._tokenizer.encode_batch([texts[i] for i in order[start:start + batch_size]])
                ids = torch.tensor([e.ids for e in encodings], dtype=torch.long)
                mask = torch.tensor([e.attention_mask for e in encodings], dtype=torch.long)
                batch = self._forward(ids, mask)
                if normalize_embeddings:
                    batch = F.normalize(batch, p=2, dim=1)
                vectors.extend(batch)
        restored = [vectors[i] for i in np.argsort(order)]
        if not restored:
            return np.zeros((0, self.dim), dtype=np.float32)
        return torch.stack(restored).numpy()
