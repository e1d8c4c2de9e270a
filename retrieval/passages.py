"""Files into passages: what ``shardrag ingest PATH…`` reads and how it cuts it.

* **Reading** (:func:`read_sections`): Markdown (``.md``, ``.markdown``: sections under their
  ``#`` headings), plain text (``.txt``, ``.text``, ``.rst``), HTML (``.html``, ``.htm``: the text of
  the page, ``<script>``/``<style>`` left out, sections under their ``<h1>``…``<h6>``) and PDF
  (``.pdf``: one section per page, read by pypdf). A section keeps its heading path
  ("Setup > Linux") and, for a PDF, its page (from 1).
* **Cutting** (:func:`split_sections`): by the encoder's own tokens — windows of ``max_tokens``
  with ``overlap`` tokens shared by neighbours, never across a section — so no passage is
  truncated by the model and each one's heading and page are exact. A window ends on a word
  boundary (it does not split a word into its WordPiece parts).

Anything unreadable raises :class:`~retrieval.errors.InvalidRequest` naming the file. pypdf and
the tokenizer (transformers) are imported when first needed.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

from retrieval.errors import InvalidRequest

MARKDOWN = (".md", ".markdown")
TEXT = (".txt", ".text", ".rst")
HTML = (".html", ".htm")
PDF = (".pdf",)
SUFFIXES = MARKDOWN + TEXT + HTML + PDF
DEFAULT_MAX_TOKENS = 200  # MiniLM reads 256 tokens; room for its special tokens and a title
DEFAULT_OVERLAP = 32
_HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")


@dataclass(frozen=True, slots=True)
class Section:
    text: str
    heading: str = ""  # the heading path, outermost first ("Setup > Linux")
    page: int | None = None  # PDF pages, from 1


@dataclass(frozen=True, slots=True)
class Passage:
    text: str
    heading: str
    page: int | None
    index: int  # its place in the file, from 0


def file_digest(path: Path) -> str:
    """The sha256 of the file's bytes (what decides whether it changed)."""
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def read_sections(path: Path) -> list[Section]:
    suffix = path.suffix.lower()
    if suffix not in SUFFIXES:
        raise InvalidRequest(f"{path}: not a file type ingest reads ({', '.join(SUFFIXES)})", field="path")
    try:
        if suffix in PDF:
            return _pdf_sections(path)
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidRequest(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})", field="path") from exc
    except OSError as exc:
        raise InvalidRequest(f"{path}: cannot read ({exc.strerror or exc})", field="path") from exc
    if suffix in MARKDOWN:
        return _markdown_sections(text)
    if suffix in HTML:
        return _html_sections(text, path)
    return [Section(text)] if text.strip() else []


def _markdown_sections(text: str) -> list[Section]:
    sections: list[Section] = []
    path: list[tuple[int, str]] = []
    lines: list[str] = []
    fenced = False

    def flush() -> None:
        if "".join(lines).strip():
            sections.append(Section("\n".join(lines).strip(), " > ".join(title for _, title in path)))
        lines.clear()

    for line in text.splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced  # a '#' inside a code block is not a heading
        found = None if fenced else _HEADING.match(line)
        if found:
            flush()
            level = len(found.group(1))
            path = [(lvl, title) for lvl, title in path if lvl < level] + [(level, found.group(2))]
        else:
            lines.append(line)
    flush()
    return sections


class _HtmlText(HTMLParser):
    SKIP = {"head", "script", "style", "noscript", "template"}  # <head>: its <title> is not body text
    BLOCK = {"p", "div", "li", "br", "tr", "section", "article", "pre", "blockquote", "td", "th"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.sections: list[Section] = []
        self.path: list[tuple[int, str]] = []
        self.parts: list[str] = []
        self.heading: list[str] | None = None
        self.level = 0
        self.skipping = 0

    def flush(self) -> None:
        text = re.sub(r"[ \t]+", " ", "".join(self.parts))
        text = re.sub(r"\s*\n\s*", "\n", text).strip()
        if text:
            self.sections.append(Section(text, " > ".join(title for _, title in self.path)))
        self.parts.clear()

    def handle_starttag(self, tag: str, attrs: Any) -> None:
        if tag in self.SKIP:
            self.skipping += 1
        elif re.fullmatch(r"h[1-6]", tag):
            self.flush()
            self.heading, self.level = [], int(tag[1])
        elif tag in self.BLOCK:
            self.parts.append("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag in self.SKIP:
            self.skipping = max(0, self.skipping - 1)
        elif re.fullmatch(r"h[1-6]", tag) and self.heading is not None:
            title = " ".join("".join(self.heading).split())
            outer = [(lvl, t) for lvl, t in self.path if lvl < self.level]
            self.path = outer + ([(self.level, title)] if title else [])
            self.heading = None
        elif tag in self.BLOCK:
            self.parts.append("\n")

    def handle_data(self, data: str) -> None:
        if self.skipping:
            return
        (self.heading if self.heading is not None else self.parts).append(data)


def _html_sections(text: str, path: Path) -> list[Section]:
    parser = _HtmlText()
    try:
        parser.feed(text)
        parser.close()
    except Exception as exc:  # noqa: BLE001 - html.parser raises assorted errors on broken markup
        raise InvalidRequest(f"{path}: cannot parse HTML ({exc})", field="path") from exc
    parser.flush()
    return parser.sections


def _pdf_sections(path: Path) -> list[Section]:
    from pypdf import PdfReader
    from pypdf.errors import PdfReadError

    try:
        reader = PdfReader(path)
        if reader.is_encrypted:
            raise InvalidRequest(f"{path}: the PDF is encrypted", field="path")
        pages = [page.extract_text() or "" for page in reader.pages]
    except (PdfReadError, ValueError, KeyError, TypeError) as exc:
        raise InvalidRequest(f"{path}: not a readable PDF ({exc})", field="path") from exc
    except OSError as exc:
        raise InvalidRequest(f"{path}: cannot read ({exc.strerror or exc})", field="path") from exc
    return [Section(text.strip(), page=number) for number, text in enumerate(pages, start=1) if text.strip()]


Tokenize = Callable[[str], Sequence[tuple[int, int]]]  # a text's tokens as (start, end) character offsets


def tokenizer_offsets(model_dir: str | Path) -> Tokenize:
    """The (start, end) offsets of each token of the encoder at ``model_dir`` (a fast tokenizer)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))

    def offsets(text: str) -> Sequence[tuple[int, int]]:
        encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True, verbose=False)
        return [(int(a), int(b)) for a, b in encoded["offset_mapping"]]

    return offsets


def split_sections(sections: Sequence[Section], tokenize: Tokenize, *, max_tokens: int = DEFAULT_MAX_TOKENS,
                   overlap: int = DEFAULT_OVERLAP) -> list[Passage]:
    if max_tokens < 8 or not 0 <= overlap < max_tokens // 2:
        raise InvalidRequest(f"passages of {max_tokens} tokens with {overlap} overlapping: need max_tokens ≥ 8 and "
                             "0 ≤ overlap < max_tokens / 2", field="max_tokens")
    passages: list[Passage] = []
    for section in sections:
        spans = tokenize(section.text)
        start = 0
        while start < len(spans):
            end = min(start + max_tokens, len(spans))
            while end < len(spans) and end - start > max_tokens // 2 and _inside_word(section.text, spans, end):
                end -= 1  # never end inside a word: its WordPiece parts stay together
            text = section.text[spans[start][0]:spans[end - 1][1]].strip()
            if text:
                passages.append(Passage(text, section.heading, section.page, len(passages)))
            if end == len(spans):
                break
            start = max(end - overlap, start + 1)
            while start < end and _inside_word(section.text, spans, start):
                start += 1  # nor start inside one
    return passages


def _inside_word(text: str, spans: Sequence[tuple[int, int]], index: int) -> bool:
    """Whether token ``index`` continues the word of the token before it (no gap between them)."""
    return index > 0 and spans[index][0] == spans[index - 1][1] and text[spans[index][0]:spans[index][1]].isalnum() \
        and text[spans[index - 1][0]:spans[index - 1][1]][-1:].isalnum()
