"""Export a sentence-transformers checkpoint to ONNX (fp32, and int8 as its own version):
``shardrag export-onnx --model M --out DIR [--int8]``, or on first use by a gateway whose
``encoder.runtime`` is ``onnx`` / ``onnx-int8`` (cached under :func:`export_cache_dir`).

Needs torch, transformers and onnx (the exporter), and onnxruntime for int8 quantisation; all
imported here, when an export runs. The transformer alone is exported (token ids → last hidden
state, dynamic batch and length); pooling stays in :class:`retrieval.onnx_encoder.OnnxEncoder`.
Crash-safe: written to a temp dir beside the destination, fsynced, renamed; the manifest is
written last, so a directory without one is never taken for an export.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import warnings
from pathlib import Path

from retrieval.atomic import atomic_write_bytes, fsync_dir, fsync_tree
from retrieval.encoders import DEFAULT_ENCODER_NAME, default_model_dir, weights_sha256
from retrieval.errors import EncoderError
from retrieval.generator_models import sha256_of
from retrieval.onnx_encoder import MANIFEST, OnnxManifest, export_cache_dir, is_onnx_export
from retrieval.types import Preprocessing

# Bumped when the export changes what it writes (opset, quantisation settings), so exports cached
# by an older release are not served as if they were this recipe's.
EXPORT_RECIPE = 2


def _pooling(model_dir: Path) -> str:
    config_path = model_dir / "1_Pooling" / "config.json"
    if not config_path.exists():
        return "mean"  # sentence-transformers' default for a bare transformer
    config = json.loads(config_path.read_text())
    if config.get("pooling_mode_mean_tokens"):
        return "mean"
    if config.get("pooling_mode_cls_token"):
        return "cls"
    raise EncoderError(f"{config_path}: only mean or CLS pooling export to ONNX", field="model")


def export_onnx(model: str | Path | None, out: str | Path, *, int8: bool = False, name: str | None = None,
                preprocessing: Preprocessing | None = None, opset: int = 17) -> OnnxManifest:
    """Export ``model`` (None/"default": MiniLM) to ``out``; returns the manifest written there."""
    import torch
    from transformers import AutoModel

    source = default_model_dir() if model in (None, "", "default", DEFAULT_ENCODER_NAME) else Path(model)
    name = name or (DEFAULT_ENCODER_NAME if source == default_model_dir() else source.name)
    preprocessing = preprocessing or Preprocessing()
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise EncoderError(f"{out} exists and is not empty: choose a new directory", field="out")
    if not (source / "tokenizer.json").exists():
        raise EncoderError(f"{source} has no tokenizer.json (a fast tokenizer is needed)", field="model")
    out.parent.mkdir(parents=True, exist_ok=True)
    temp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        # eager attention traces to plain ops; the wrapper fixes the argument order for the tracer
        transformer = AutoModel.from_pretrained(str(source), add_pooling_layer=False,
                                                attn_implementation="eager").eval()

        class HiddenStates(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.transformer = transformer

            def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                        token_type_ids: torch.Tensor) -> torch.Tensor:
                hidden: torch.Tensor = self.transformer(input_ids=input_ids, attention_mask=attention_mask,
                                                        token_type_ids=token_type_ids).last_hidden_state
                return hidden

        kinds = ("input_ids", "attention_mask", "token_type_ids")
        sample = tuple(torch.ones((2, 8), dtype=torch.long) for _ in kinds)
        axes = {kind: {0: "batch", 1: "tokens"} for kind in (*kinds, "last_hidden_state")}
        with torch.no_grad(), warnings.catch_warnings():
            # the tracer's notes on shapes it fixes (the mask's padding branch) and on index ops
            # are about inputs this graph never gets (dynamic axes cover batch and length)
            warnings.simplefilter("ignore")
            torch.onnx.export(HiddenStates().eval(), sample, str(temp / "fp32.onnx"), input_names=list(kinds),
                              output_names=["last_hidden_state"], dynamic_axes=axes, opset_version=opset,
                              dynamo=False)
        if int8:
            from onnxruntime.quantization import QuantType, quantize_dynamic

            # per-channel scales: per-tensor int8 left MiniLM's query vectors at cosine 0.966 (mean) to
            # fp32's on msmarco's queries, per-channel at 0.993, for the same speed
            quantize_dynamic(str(temp / "fp32.onnx"), str(temp / "model.onnx"), weight_type=QuantType.QInt8,
                             per_channel=True)
            (temp / "fp32.onnx").unlink()
        else:
            (temp / "fp32.onnx").rename(temp / "model.onnx")
        shutil.copy2(source / "tokenizer.json", temp / "tokenizer.json")
        dim = int(transformer.config.hidden_size)
        manifest = OnnxManifest(encoder_name=name, source_weights_sha256=weights_sha256(source),
                                precision="int8" if int8 else "fp32", pooling=_pooling(source), dim=dim,
                                preprocessing=preprocessing, onnx_sha256=sha256_of(temp / "model.onnx"), opset=opset)
        fsync_tree(temp)
        atomic_write_bytes(temp / MANIFEST, manifest.to_json().encode())  # last: marks the export complete
        if out.exists():
            out.rmdir()
        temp.rename(out)
        fsync_dir(out.parent)
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise
    return manifest


def cached_export(model: str | Path | None, *, int8: bool = False) -> Path:
    """The export of ``model`` made on first use and kept (keyed by its weights hash). Encoder
    workers starting together export once: the others wait on the lock, then find it done."""
    import fcntl

    source = default_model_dir() if model in (None, "", "default", DEFAULT_ENCODER_NAME) else Path(model)
    out = export_cache_dir() / f"{weights_sha256(source)[:16]}-{'int8' if int8 else 'fp32'}-e{EXPORT_RECIPE}"
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f".{out.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not is_onnx_export(out):
            if out.exists():  # not an export (no manifest): nothing of ours, but in our way
                shutil.rmtree(out)
            export_onnx(model, out, int8=int8)
    return out
