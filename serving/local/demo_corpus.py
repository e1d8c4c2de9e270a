"""A corpus that is always there offline: Python's own documentation.

``pydoc_data.topics`` (the language reference topics behind ``help()``) and the docstrings of
the standard library's modules, classes and functions, read with ``ast`` (nothing is
imported). Long texts are cut into passages of at most ``max_words`` words on paragraph
boundaries. Deterministic: the same Python gives the same corpus.
"""

from __future__ import annotations

import ast
import sysconfig
from collections.abc import Iterator
from pathlib import Path

from retrieval.types import DocId, Document

_SKIP_PARTS = {"test", "tests", "idlelib", "turtledemo", "lib2to3", "site-packages", "dist-packages", "ensurepip",
               "__pycache__", "pydoc_data", "tkinter", "venv"}


def _passages(text: str, max_words: int) -> list[str]:
    paragraphs = [" ".join(p.split()) for p in text.split("\n\n")]
    passages: list[str] = []
    current: list[str] = []
    for paragraph in filter(None, paragraphs):
        words = paragraph.split()
        while len(words) > max_words:  # a single over-long paragraph
            if current:
                passages.append(" ".join(current))
                current = []
            passages.append(" ".join(words[:max_words]))
            words = words[max_words:]
        if len(current) + len(words) > max_words and current:
            passages.append(" ".join(current))
            current = []
        current.extend(words)
    if current:
        passages.append(" ".join(current))
    return passages


def _topics(max_words: int) -> Iterator[Document]:
    from pydoc_data.topics import topics

    for name in sorted(topics):
        for i, passage in enumerate(_passages(topics[name], max_words)):
            yield Document(DocId(f"topic/{name}#{i}"), passage, f"Python reference: {name}", {"source": "pydoc_data"})


def _docstrings(max_words: int, min_chars: int = 160) -> Iterator[Document]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(stdlib.rglob("*.py")):
        relative = path.relative_to(stdlib)
        if _SKIP_PARTS & set(relative.parts) or relative.name.startswith("_"):
            continue
        module = ".".join(relative.with_suffix("").parts)
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, OSError):
            continue
        nodes: list[tuple[str, ast.AST]] = [(module, tree)]
        for statement in tree.body:
            if not isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            if not statement.name.startswith("_"):
                nodes.append((f"{module}.{statement.name}", statement))
                if isinstance(statement, ast.ClassDef):
                    nodes.extend((f"{module}.{statement.name}.{child.name}", child) for child in statement.body
                                 if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
                                 and not child.name.startswith("_"))
        for qualname, node in nodes:
            if not isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            docstring = ast.get_docstring(node)
            if not docstring or len(docstring) < min_chars:
                continue
            for i, passage in enumerate(_passages(docstring, max_words)):
                yield Document(DocId(f"py/{qualname}#{i}"), passage, qualname, {"source": "stdlib", "module": module})


def python_docs_corpus(max_docs: int = 1000, max_words: int = 120) -> list[Document]:
    """Up to ``max_docs`` passages: every reference topic first, then stdlib docstrings."""
    documents: list[Document] = []
    for source in (_topics(max_words), _docstrings(max_words)):
        for document in source:
            if len(documents) >= max_docs:
                return documents
            documents.append(document)
    return documents
