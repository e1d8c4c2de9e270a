"""Synthetic training queries for a slice's passages, written by the project's generator model
(InPars / Promptagator-style), filtered by round-trip consistency, cached on disk.

* Prompt (``PROMPT_VERSION``): a few in-domain-neutral examples written for this purpose — never
  taken from any evaluation set's ``queries.jsonl`` — then the passage; the model completes the
  query line. A plain-text prompt, so base and instruct models both follow it.
* Greedy decoding in fixed-size batches: the same passages, model and settings give the same
  queries (deterministic for a seed: the seed picks which passages get queries).
* Cache: one append-only JSON-lines file per (generator model id, prompt version, decoding
  settings), a line per passage keyed by the sha256 of its text. Each batch is appended and
  fsynced, so an interrupted generation resumes with the passages it has not done; a torn last
  line (a crash mid-write) is cut off when the file is next opened.
* Round trip: a pair is kept only when its passage ranks in the current encoder's top-k for the
  query among the slice's passages.
* Runs on the GPU when one is present (fp32: the model is small and the queries short).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from retrieval.atomic import fsync_dir
from retrieval.errors import ConfigError

logger = logging.getLogger(__name__)

PROMPT_VERSION = "inpars-v1"
# Written for this purpose (not from any evaluation set): three short passages and a query each.
FEW_SHOT = (
    ("The Nile flows north through eleven countries and empties into the Mediterranean Sea near "
     "Alexandria; its two main tributaries are the White Nile and the Blue Nile.",
     "which sea does the nile river flow into"),
    ("Sourdough bread is leavened by a culture of wild yeast and lactic acid bacteria, which gives "
     "it a sour taste and keeps it fresh longer than bread made with baker's yeast.",
     "why does sourdough bread taste sour"),
    ("Marie Curie was the first person to win Nobel Prizes in two different sciences, physics in "
     "1903 and chemistry in 1911, for her work on radioactivity.",
     "marie curie nobel prizes physics chemistry"),
)
MAX_PASSAGE_CHARS = 700


def build_prompt(passage: str) -> str:
    shots = "".join(f"Document: {text}\nRelevant query: {query}\n\n" for text, query in FEW_SHOT)
    body = " ".join(passage.split())[:MAX_PASSAGE_CHARS]
    return f"{shots}Document: {body}\nRelevant query:"


def passage_hash(passage: str) -> str:
    return hashlib.sha256(passage.encode()).hexdigest()


@dataclass(slots=True, frozen=True)
class GenerationSettings:
    max_new_tokens: int = 24
    batch_size: int = 8

    def key(self, model_id: str) -> str:
        ident = f"{model_id}|{PROMPT_VERSION}|greedy|{self.max_new_tokens}|{self.batch_size}"
        return hashlib.sha256(ident.encode()).hexdigest()[:16]


class QueryCache:
    """Append-only JSON lines ``{"h": passage sha256, "q": query or null}``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.entries: dict[str, str | None] = {}
        if path.exists():
            data = path.read_bytes()
            keep = data[: data.rfind(b"\n") + 1]  # a torn last line is dropped
            if len(keep) != len(data):
                with open(path, "r+b") as handle:
                    handle.truncate(len(keep))
            for line in keep.splitlines():
                record = json.loads(line)
                self.entries[record["h"]] = record["q"]

    def append(self, items: Sequence[tuple[str, str | None]]) -> None:
        new_file = not self.path.exists()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as handle:
            for digest, query in items:
                handle.write(json.dumps({"h": digest, "q": query}) + "\n")
                self.entries[digest] = query
            handle.flush()
            os.fsync(handle.fileno())
        if new_file:
            fsync_dir(self.path.parent)


def _clean(text: str) -> str | None:
    line = text.strip().split("\n", 1)[0].strip().strip('"').strip()
    return line[:200] if len(line) >= 3 else None


class QueryGenerator:
    """``spec``: ``smollm2`` (the answer generator's model) or a Hugging Face causal-LM directory."""

    def __init__(self, spec: str = "smollm2", *, cache_dir: Path, settings: GenerationSettings | None = None,
                 device: str = "auto") -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from retrieval.generator_models import sha256_of, smollm2_dir

        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        directory = smollm2_dir() if spec == "smollm2" else Path(spec)
        if not (directory / "config.json").exists():
            raise ConfigError(f"{directory} is not a Hugging Face model directory", field="synthetic_queries")
        weights = sorted(directory.glob("*.safetensors")) or sorted(directory.glob("*.bin"))
        self.model_id = f"{directory.name}@{sha256_of(weights[0])[:16]}" if weights else directory.name
        self.settings = settings or GenerationSettings()
        self.device = torch.device("cuda" if device == "auto" and torch.cuda.is_available() else
                                   "cpu" if device == "auto" else device)
        self.tokenizer = AutoTokenizer.from_pretrained(str(directory))
        self.tokenizer.padding_side = "left"  # generation continues the right end of every row
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model = AutoModelForCausalLM.from_pretrained(str(directory), dtype=torch.float32).to(self.device)  # type: ignore[arg-type]  # transformers types .to() as a model method
        self.model.eval()
        self.cache = QueryCache(cache_dir / "synthetic-queries" / f"{self.settings.key(self.model_id)}.jsonl")
        self.generated = 0  # passages generated by this object (not found in the cache)

    def _generate(self, passages: Sequence[str]) -> list[str | None]:
        import torch

        prompts = [build_prompt(p) for p in passages]
        tokens = self.tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False,
                                return_token_type_ids=False).to(self.device)
        with torch.no_grad():
            output = self.model.generate(**tokens, max_new_tokens=self.settings.max_new_tokens, do_sample=False,
                                         pad_token_id=self.tokenizer.pad_token_id)
        new = output[:, tokens["input_ids"].shape[1]:]
        return [_clean(str(self.tokenizer.decode(row, skip_special_tokens=True))) for row in new]

    def queries(self, passages: Sequence[str], *, progress: bool = False) -> list[str | None]:
        """A query per passage (None where the model wrote nothing usable), from the cache when there."""
        from tqdm.auto import tqdm

        digests = [passage_hash(p) for p in passages]
        missing = list(dict.fromkeys(i for i, d in enumerate(digests) if d not in self.cache.entries))
        size = self.settings.batch_size
        for start in tqdm(range(0, len(missing), size), desc="synthetic queries", unit="batch", disable=not progress):
            chunk = missing[start:start + size]
            written = self._generate([passages[i] for i in chunk])
            self.cache.append([(digests[i], q) for i, q in zip(chunk, written)])
            self.generated += len(chunk)
        return [self.cache.entries.get(d) for d in digests]


def round_trip(queries: Sequence[str], positives: Sequence[int], passage_vectors: np.ndarray,
               encode: Callable[[Sequence[str]], np.ndarray], k: int) -> list[bool]:
    """Whether each query's own passage (row ``positives[i]`` of ``passage_vectors``) is in its
    top ``k`` among all the rows — the current encoder agrees the query is about that passage."""
    if not queries:
        return []
    scores = encode(queries) @ passage_vectors.T
    own = scores[np.arange(len(queries)), np.asarray(positives)]
    better = (scores > own[:, None]).sum(axis=1)
    return [bool(b < k) for b in better]


def make_tiny_generator(target: Path, *, seed: int = 0) -> Path:
    """A small randomly initialised Llama with MiniLM's tokenizer, saved as a Hugging Face
    directory: the real generation path at a fraction of the cost (tests)."""
    import shutil

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from retrieval.encoders import default_model_dir

    target.mkdir(parents=True, exist_ok=True)
    base = default_model_dir()
    config = LlamaConfig(vocab_size=30522, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=1024,
                         pad_token_id=0, bos_token_id=101, eos_token_id=102)
    torch.manual_seed(seed)
    LlamaForCausalLM(config).save_pretrained(str(target))
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        if (base / name).exists():
            shutil.copy2(base / name, target / name)
    return target


def describe(generator: Any) -> dict[str, Any]:
    return {"model": generator.model_id, "prompt_version": PROMPT_VERSION, "cache": str(generator.cache.path),
            "generated": generator.generated}
