"""Training configuration: one dataclass, every field commented. The CLI and the torchrun entry
point fill it from flags; JSON round-trips it into checkpoints."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from retrieval.errors import ConfigError


@dataclass(slots=True, frozen=True)
class TrainConfig:
    root: str  # collections root
    collection: str  # the collection whose slices the ranks train on
    version: str | None = None  # its version to read (default: the newest complete one)
    model: str = "default"  # initial encoder: "default" (MiniLM) or a sentence-transformers checkpoint dir
    out: str = "train-out"  # run directory: checkpoints, metrics, the exported encoder
    export_name: str = "minilm-shardrag"  # name of the exported encoder (part of its embedding version id)
    export: bool = True  # export at the end (the rollout flow exports as a step of its own)
    train_queries: str | None = None  # given pairs: queries.jsonl (BEIR) ...
    train_qrels: str | None = None  # ... and qrels whose positives pick the rank; else self-supervised pairs
    max_steps: int = 100  # optimizer steps
    batch_size: int = 16  # pairs per rank per micro-step
    grad_accum: int = 1  # micro-steps per optimizer step
    lr: float = 2e-5  # AdamW learning rate (peak)
    warmup_steps: int = 10  # linear warm-up, then linear decay to 0
    weight_decay: float = 0.01
    max_length: int = 128  # tokens per query/passage during training
    scale: float = 20.0  # InfoNCE logit scale (1 / temperature)
    learn_scale: bool = False  # learn the scale (log-parametrised) instead of fixing it
    gather_negatives: bool = True  # in-batch negatives from every rank (else local batch only)
    comm_hook: str = "none"  # DDP gradient compression: none, fp16, bf16, powersgd
    bucket_cap_mb: float = 25.0  # DDP gradient bucket size (torch's default); hooks run once per bucket
    amp: str = "auto"  # mixed precision (training.precision): auto, off, bf16, fp16
    checkpoint_every: int = 20  # steps between atomic checkpoints (and at the end)
    seed: int = 0
    crop_min: float = 0.1  # self-supervised cropping: each span is crop_min..crop_max of the words
    crop_max: float = 0.5
    hard_negatives_url: str | None = None  # gateway to mine hard negatives from (None: off)
    hard_negatives_every: int = 50  # refresh period of the mined negatives, in steps
    synthetic_queries: str | None = None  # generator ("smollm2" or a HF dir) writing a query per passage
    synthetic_max: int = 0  # passages per slice that get a synthetic query (0: all)
    synthetic_cache: str | None = None  # where generated queries are cached (default: the shardrag cache)
    round_trip_k: int = 10  # keep a synthetic pair when its passage is in the encoder's top-k in the slice
    refresh_every: int = 0  # slice-local hard negatives: re-encode the own slice every N steps (0: off)
    negatives_depth: int = 5  # slice-local: candidates per query and slice
    straggler_factor: float = 1.5  # a rank this much slower than the median...
    straggler_window: int = 10  # ...over this many steps is reported
    threads: int = 0  # CPU threads per rank (0: the machine's cores / local ranks)
    diagnostics: bool = False  # per-rank JSON of what each rank read and computed (tests)
    log_every: int = 1  # progress bar refresh, in steps

    def validate(self) -> TrainConfig:
        positive = ("max_steps", "batch_size", "grad_accum", "max_length", "checkpoint_every", "straggler_window",
                    "hard_negatives_every", "log_every")
        for name in positive:
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be ≥ 1", field=name)
        if self.threads < 0:
            raise ConfigError("threads must be ≥ 0 (0: this host's cores / its ranks)", field="threads")
        if self.bucket_cap_mb <= 0:
            raise ConfigError("bucket_cap_mb must be > 0", field="bucket_cap_mb")
        if self.lr <= 0 or self.scale <= 0:
            raise ConfigError("lr and scale must be > 0", field="lr")
        if not 0 < self.crop_min <= self.crop_max <= 1:
            raise ConfigError("need 0 < crop_min ≤ crop_max ≤ 1", field="crop_min")
        if self.comm_hook not in ("none", "fp16", "bf16", "powersgd"):
            raise ConfigError("comm_hook must be none, fp16, bf16 or powersgd", field="comm_hook")
        if self.amp not in ("auto", "off", "bf16", "fp16"):
            raise ConfigError("amp must be auto, off, bf16 or fp16", field="amp")
        if self.refresh_every < 0 or self.negatives_depth < 1:
            raise ConfigError("refresh_every must be ≥ 0 and negatives_depth ≥ 1", field="refresh_every")
        if self.refresh_every and self.hard_negatives_url:
            raise ConfigError("choose one source of hard negatives: the serving index (hard_negatives_url) or "
                              "the refreshed slices (refresh_every)", field="refresh_every")
        if self.synthetic_queries and self.train_queries:
            raise ConfigError("train on given pairs or on synthetic queries, not both", field="synthetic_queries")
        if self.synthetic_max < 0 or self.round_trip_k < 1:
            raise ConfigError("synthetic_max must be ≥ 0 and round_trip_k ≥ 1", field="synthetic_max")
        if (self.train_queries is None) != (self.train_qrels is None):
            raise ConfigError("give both train_queries and train_qrels, or neither", field="train_qrels")
        return self

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known}).validate()
