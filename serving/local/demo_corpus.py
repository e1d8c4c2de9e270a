"""A corpus that is always there offline: Python's own documentation.

``pydoc_data.topics`` (the language reference topics behind ``help()``, cut at their section
headings, each passage titled with its topic and section), the built-ins' docstrings (with their
signatures), and the docstrings of the standard library's modules (a package's ``__init__``
included: ``re``, ``json``, ``logging``, ``collections``, ...), classes and module-level
functions, read with ``ast`` (nothing is imported). Left out: methods of stdlib classes (short
texts such as ``cmd.Cmd.parseline`` that outrank the module a question is about, measured in
``cmd_demo``'s notes) and the modules deprecated for removal (PEP 594, ``distutils``), which no
one should be pointed to. Long texts are cut into passages of at most ``max_words`` words on
paragraph boundaries; a module's own docstring is kept however short (it names what the module is
for), others from ``min_chars``. Deterministic: the same Python gives the same corpus.
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
# deprecated and removed in 3.12/3.13 (PEP 594 "dead batteries", PEP 632 distutils): a demo should
# not answer "run a shell command" with distutils.cmd or "log to a file" with cgi.initlog
_DEPRECATED_MODULES = {"distutils", "cgi", "cgitb", "asynchat", "asyncore", "smtpd", "imp", "aifc", "audioop",
                       "chunk", "crypt", "imghdr", "mailcap", "msilib", "nis", "nntplib", "ossaudiodev", "pipes",
                       "sndhdr", "spwd", "sunau", "telnetlib", "uu", "xdrlib"}
_UNDERLINE = set("=-*~^")


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


def _sections(text: str) -> Iterator[tuple[str, str]]:
    """(heading, body) for each section of a reStructuredText-like topic: a heading is a line
    underlined by a row of ``=``, ``-``, ``*``, ... of at least three characters."""
    lines = text.split("\n")
    heading, body = "", list[str]()
    for i, line in enumerate(lines):
        following = lines[i + 1] if i + 1 < len(lines) else ""
        if line.strip() and len(following) >= 3 and set(following) <= _UNDERLINE:
            if any(b.strip() for b in body):
                yield heading, "\n".join(body)
            heading, body = line.strip(), []
        elif not (len(line) >= 3 and set(line) <= _UNDERLINE):
            body.append(line)
    if any(b.strip() for b in body):
        yield heading, "\n".join(body)


def _topics(max_words: int) -> Iterator[Document]:
    from pydoc_data.topics import topics

    for name in sorted(topics):
        # "Sequence Types — list, tuple, range › Lists" says more than the topic key "typesseq"
        index, first_heading = 0, ""
        for heading, body in _sections(topics[name]):
            first_heading = first_heading or heading or name
            title = f"Python reference: {first_heading}" + (f" › {heading}" if heading and heading != first_heading
                                                             else "")
            for passage in _passages(body, max_words):
                yield Document(DocId(f"topic/{name}#{index}"), passage, title, {"source": "pydoc_data"})
                index += 1


def stdlib_modules(stdlib: Path) -> Iterator[tuple[str, Path]]:
    """(dotted name, source file) of every standard-library module the corpus reads, in path order."""
    for path in sorted(stdlib.rglob("*.py")):
        relative = path.relative_to(stdlib)
        parts = relative.with_suffix("").parts
        if parts[-1] == "__init__":  # a package's own docstring and API: re, json, logging, collections, ...
            parts = parts[:-1]
        if (not parts or _SKIP_PARTS & set(relative.parts) or any(part.startswith("_") for part in parts)
                or parts[0] in _DEPRECATED_MODULES):
            continue
        yield ".".join(parts), path


def _docstrings(max_words: int, min_chars: int = 160) -> Iterator[Document]:
    for module, path in stdlib_modules(Path(sysconfig.get_paths()["stdlib"])):
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
    """The built-in functions and classes and the methods of the built-in types (``sorted``, ``list.sort``,
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
            if len(doc) < min_chars:
                continue
            short = qualname.removeprefix("builtins.")
            signature = _signature(obj)
            if signature:  # "sorted(iterable, /, *, key=None, reverse=False): Return a new list ..."
                doc = f"{short}{signature}: {doc}"
            kind = "class" if isinstance(obj, type) else "function" if "." not in short else \
                f"method of the built-in {short.split('.')[0]} type"
            title = f"{short} — {kind}" if kind.startswith("method") else f"{short} — built-in {kind}"
            yield Document(DocId(f"py/{qualname}#0"), doc, title, {"source": "builtins", "module": "builtins"})


def _signature(obj: object) -> str:
    """The C signature a built-in carries (``__text_signature__``), without the ``$self`` /
    ``$type`` / ``$module`` placeholders; "" when it has none."""
    signature = getattr(obj, "__text_signature__", None)
    if not isinstance(signature, str):
        return ""
    for placeholder in ("$self, ", "$type, ", "$module, ", "$self", "$type", "$module"):
        signature = signature.replace(placeholder, "")
    return signature


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
