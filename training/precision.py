"""Mixed precision for the training step: which autocast, and whether a GradScaler.

``auto`` (the default) is what a user wants without thinking: bf16 autocast on a GPU that has
bf16 (no scaler: bf16 has fp32's exponent range), fp16 + GradScaler on an older GPU, fp32 on CPU
(CPU bf16 autocast pays only with bf16 instructions — avx512_bf16 or AMX: ×0.63 of the fp32 step
on an EPYC that has them, docs/training.md — and is slower without). ``bf16`` forces bf16
autocast on any device (measure it: ``python -m benchmarks.training --systems``);
``fp16`` needs CUDA (the GradScaler does); ``off`` is fp32 everywhere.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch

from retrieval.errors import ConfigError

AMP_MODES = ("auto", "off", "bf16", "fp16")


@dataclass(frozen=True, slots=True)
class Precision:
    name: str  # what the step runs in: fp32, bf16 or fp16
    dtype: torch.dtype | None  # the autocast dtype (None: no autocast)
    device_type: str
    scaler: Any  # torch.amp.GradScaler for fp16, else None

    def autocast(self) -> AbstractContextManager[Any]:
        if self.dtype is None:
            return nullcontext()
        return torch.autocast(self.device_type, dtype=self.dtype)


def resolve_precision(mode: str, device: torch.device) -> Precision:
    """The precision ``mode`` means on ``device``; a clear error where it cannot run."""
    if mode not in AMP_MODES:
        raise ConfigError(f"amp must be one of {', '.join(AMP_MODES)}", field="amp")
    cuda = device.type == "cuda"
    if mode == "auto":
        mode = ("bf16" if torch.cuda.is_bf16_supported() else "fp16") if cuda else "off"
    if mode == "off":
        return Precision("fp32", None, device.type, None)
    if mode == "fp16":
        if not cuda:
            raise ConfigError("amp fp16 needs a CUDA GPU (its GradScaler does); use bf16 or off on CPU", field="amp")
        return Precision("fp16", torch.float16, "cuda", torch.amp.GradScaler("cuda"))
    return Precision("bf16", torch.bfloat16, device.type, None)
