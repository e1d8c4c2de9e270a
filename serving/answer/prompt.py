"""The RAG prompt: a fixed system prompt, the retrieved passages numbered in rank order, then the
question. Deterministic, and the question comes last, so the same retrieval gives the same
token prefix — which is what lets the KV cache serve it again, whatever the question."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

SYSTEM_PROMPT = ("You are a helpful assistant. Answer the question using only the numbered passages. "
                 "Cite the passages you use like [1]. If they do not contain the answer, say so.")
MAX_PASSAGE_CHARS = 700


def passage_block(hits: Sequence[dict[str, Any]]) -> str:
    lines = []
    for number, hit in enumerate(hits, start=1):
        text = " ".join(str(hit.get("text", "")).split())[:MAX_PASSAGE_CHARS]
        title = str(hit.get("title") or "").strip()
        lines.append(f"[{number}] {title}: {text}" if title else f"[{number}] {text}")
    return "\n".join(lines)


def build_messages(question: str, hits: Sequence[dict[str, Any]]) -> list[dict[str, str]]:
    user = f"Passages:\n{passage_block(hits)}\n\nQuestion: {question.strip()}"
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]
