"""The RAG prompt: a fixed system prompt, the retrieved passages numbered in rank order, then the
question. Deterministic, and the question comes last, so the same retrieval gives the same
token prefix — which is what lets the KV cache serve it again, whatever the question."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

SYSTEM_PROMPT = ("You are a helpful assistant. Answer the question using only the numbered passages. "
                 "Cite the passages you use like [1]. If they do not contain the answer, say so.")
MAX_PASSAGE_CHARS = 700


def passage_texts(hits: Sequence[dict[str, Any]]) -> list[str]:
    """Each passage as it appears in the prompt, without its number: the same text (so the same
    tokens and the same cached KV) wherever the passage ranks."""
    texts = []
    for hit in hits:
        text = " ".join(str(hit.get("text", "")).split())[:MAX_PASSAGE_CHARS]
        title = str(hit.get("title") or "").strip()
        texts.append(f"{title}: {text}" if title else text)
    return texts


def passage_block(hits: Sequence[dict[str, Any]]) -> str:
    return "\n".join(f"[{number}] {text}" for number, text in enumerate(passage_texts(hits), start=1))


def build_messages(question: str, hits: Sequence[dict[str, Any]]) -> list[dict[str, str]]:
    user = f"Passages:\n{passage_block(hits)}\n\nQuestion: {question.strip()}"
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]
