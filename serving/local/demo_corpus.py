"""A corpus that is always there offline: Python's own documentation.

``pydoc_data.topics`` (the language reference topics behind ``help()``), the built-ins'
docstrings, and the docstrings of the standard library's modules, classes and functions, read with ``ast`` (nothing is
imported). Long texts are cut into passages of at most ``max_words`` words on paragraph
boundaries; a module's own docstring is kept however short (it names what the module is for),
others from ``min_chars``. Deterministic: the same Python gives the same corpus.
"""

from __future__ import annotations

import ast
import itertools
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
        summary = (ast.get_docstring(tree) or "").strip().split("\n")[0].strip(" .")[:100]
        for qualname, node in nodes:
            if not isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            docstring = ast.get_docstring(node)
            if not docstring or (len(docstring) < min_chars and not isinstance(node, ast.Module)):
                continue
            # the title says which module a passage belongs to and what that module is for, so
            # "make an HTTP request" can tell http.client ("HTTP/1.1 client library") from http.server
            title = f"{qualname} ({summary})" if summary and qualname != module else \
                f"{module} module: {summary}" if summary else qualname
            for i, passage in enumerate(_passages(docstring, max_words)):
                yield Document(DocId(f"py/{qualname}#{i}"), passage, title, {"source": "stdlib", "module": module})


def _builtins(min_chars: int = 60) -> Iterator[Document]:
    """The built-in functions and the methods of the built-in types (``sorted``, ``list.sort``,
    ``dict.get``, ``str.split``, ...): implemented in C, so not in any .py file, but their
    docstrings are in the running interpreter (nothing is imported for them)."""
    import builtins

    names = sorted(n for n in dir(builtins) if not n.startswith("_"))
    for name in names:
        value = getattr(builtins, name)
        if isinstance(value, type) and issubclass(value, BaseException):
            continue
        entries = [(f"builtins.{name}", value)]
        if isinstance(value, type):
            entries += [(f"builtins.{name}.{m}", getattr(value, m)) for m in sorted(vars(value))
                        if not m.startswith("_")]
        for qualname, obj in entries:
            doc = " ".join((getattr(obj, "__doc__", None) or "").split())
            if len(doc) >= min_chars:
                yield Document(DocId(f"py/{qualname}#0"), doc, f"{qualname} (built-in)",
                               {"source": "builtins", "module": "builtins"})


def python_docs_corpus(max_docs: int = 0, max_words: int = 120) -> list[Document]:
    """Every reference topic and stdlib docstring passage; with ``max_docs`` (> 0), a sample of
    that many spread over all modules and topics — round robin over the groups (the reference
    topics, then each top-level module), each group's passages in order — rather than the first
    ``max_docs`` in alphabetical order, which would be a handful of modules."""
    groups: dict[str, list[Document]] = {}
    for document in _topics(max_words):
        groups.setdefault("topics", []).append(document)
    for document in itertools.chain(_builtins(), _docstrings(max_words)):
        groups.setdefault(str(document.metadata["module"]).split(".")[0], []).append(document)
    everything = [d for group in groups.values() for d in group]
    if max_docs <= 0 or len(everything) <= max_docs:
        return everything
    sample: list[Document] = []
    queues = [list(group) for group in groups.values()]
    while len(sample) < max_docs:
        for queue in queues:
            if queue and len(sample) < max_docs:
                sample.append(queue.pop(0))
    return sample
