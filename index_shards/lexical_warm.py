"""When a replica builds a base's lexical index: on the first lexical query, or before one arrives.

A base's inverted index is derived from its documents and built on first use
(``Shard.lexicon``): well under a second for ten thousand documents, about a minute per million
on one core. Built lazily, that minute lands on the first lexical or hybrid query after every
restart, rollout activation and snapshot restore — a stall of the tail exactly when a replica
comes back. So a replica that has served a lexical query remembers it (a marker file in its data
dir, written once, crash-safely), and from then on builds the index of every base it loads ahead
of the queries:

- a staged version (a rollout) becomes ``ready`` only once its index is built — the version it
  replaces keeps serving meanwhile, so no query waits;
- the version a replica starts with, and a base restored from a peer's snapshot, serve dense
  queries at once and build it in a background thread (a lexical query arriving meanwhile waits
  for the rest of that build, as it would have for all of it);
- a compaction builds the new base's before it swaps it in (``index_shards.compaction``).

Where: a base of :data:`APART_MIN_DOCS` documents or more is indexed in a child process
(:func:`build_base_lexicon`, whoever asks — a warm-up, a first lexical query, a compaction). In the
serving process the build's minute of pure Python would hold the GIL against every query there:
each time a query's thread lets go of it (a FAISS search, every row SQLite steps) it waits up to
the interpreter's 5 ms switch interval to get it back: dense queries ran 8–11× slower at the
median and 45–70× at p99 while a 100k-document index was built beside them, ~90× at the median
while a 20k one was; built in a child, 1.0–1.06× and 1.25–1.5× (2 cores,
``python -m benchmarks.lexical_warm``; p99 4.9× in one round at 20k). The child reads the
shard's document store itself and sends the arrays back; only unpickling them is in process.

Modes (``--lexical-warm``): ``auto`` (the default: as above), ``always`` (also before the first
lexical query: for a collection known to serve hybrid queries, at the cost of building an index
that may never be read — ~212 MiB a million documents), ``lazy`` (only on first use: for
replicas that never serve lexical queries, or memory that cannot spare it).
"""

from __future__ import annotations

import logging
import multiprocessing
import threading
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import TYPE_CHECKING

from index_shards.docstore import DocStore
from index_shards.lexical import BaseLexicon
from retrieval.analysis import DEFAULT_LANGUAGE
from retrieval.atomic import atomic_write_bytes
from retrieval.errors import ConfigError

if TYPE_CHECKING:
    from index_shards.shard import Shard

WARM_MODES = ("auto", "always", "lazy")
# Below this a build takes half a second or less on one core: in process (a child costs 0.2–0.4 s more)
APART_MIN_DOCS = 10_000
USED_MARKER = "lexical.used"  # in the replica's data dir: it has served a lexical query

logger = logging.getLogger(__name__)


class LexicalWarmth:
    """One replica's policy for building its bases' lexical indexes ahead of the queries."""

    def __init__(self, mode: str = "auto", data_dir: Path | None = None) -> None:
        if mode not in WARM_MODES:
            raise ConfigError(f"lexical_warm must be one of {', '.join(WARM_MODES)}, got {mode!r}",
                              field="lexical_warm")
        self.mode = mode
        self._marker = data_dir / USED_MARKER if data_dir is not None else None
        self._used = self._marker is not None and self._marker.is_file()
        self._lock = threading.Lock()

    @property
    def wanted(self) -> bool:
        """Whether a base this replica loads should have its lexical index built before it is asked."""
        return self.mode == "always" or (self.mode == "auto" and self._used)

    def note_used(self) -> None:
        """This replica answered a lexical query: remember it, across restarts too (once)."""
        if self._used:
            return
        with self._lock:
            if self._used:
                return
            if self._marker is not None:
                try:
                    atomic_write_bytes(self._marker, b"a lexical query was served here; bases are built warm\n")
                except OSError as exc:  # the query is answered regardless; only the next restart is cold
                    logger.warning("could not record lexical use in %s: %s", self._marker, exc)
            self._used = True

    def warm_now(self, shard: Shard) -> None:
        """Build ``shard``'s lexical index here, when wanted (a staged version, a compacted base)."""
        if self.wanted:
            shard.lexicon  # noqa: B018 - the property builds it

    def warm_soon(self, shard: Shard) -> threading.Thread | None:
        """Build ``shard``'s lexical index in a background thread, when wanted and not built yet
        (the base a replica serves from at once). The thread, for tests that wait on it."""
        if not self.wanted or shard.has_lexicon:
            return None
        thread = threading.Thread(target=_build, args=(shard,), daemon=True, name=f"lexicon-{shard.directory.name}")
        thread.start()
        return thread


def _build(shard: Shard) -> None:
    try:
        shard.lexicon  # noqa: B018 - the property builds it
    except Exception:  # noqa: BLE001 - a failed warm-up leaves the lazy build to the first query, which reports it
        logger.exception("building the lexical index of %s ahead of the queries failed", shard.directory)


def build_base_lexicon(docstore: DocStore, *, language: str = DEFAULT_LANGUAGE,
                       apart_min_docs: int | None = None) -> BaseLexicon:
    """The base's lexical index from its document store, its texts analysed in ``language``: in a
    child process when the base holds ``apart_min_docs`` documents or more (module docstring), else
    here. A child that cannot be started or dies leaves the build to this process."""
    threshold = APART_MIN_DOCS if apart_min_docs is None else apart_min_docs
    if docstore.count >= threshold:
        try:
            with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
                return pool.submit(_build_from_file, str(docstore.path), language).result()
        except (OSError, BrokenProcessPool) as exc:
            logger.warning("building the lexical index of %s in a child process failed (%s): building it here",
                           docstore.path, exc)
    return _build_from(docstore, language)


def _build_from(docstore: DocStore, language: str) -> BaseLexicon:
    return BaseLexicon.build(((i, d.title, d.text) for i, d in docstore.iter_all()), language)


def _build_from_file(path: str, language: str) -> BaseLexicon:
    store = DocStore(Path(path))
    try:
        return _build_from(store, language)
    finally:
        store.close()
