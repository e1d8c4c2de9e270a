"""Shared fixtures: data paths, real embeddings (cached on disk), built collections, a report
section printed at the end of the run for figures tests measure (recall of routing, nDCG)."""

from __future__ import annotations

import compileall
import os
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from retrieval import env
from retrieval.datasets import BeirDataset, load_beir
from retrieval.types import Document, EmbeddingVersion

# Haystack reports usage to its own servers from the moment it is imported: tests send traffic only
# to the processes they start
os.environ["HAYSTACK_TELEMETRY_ENABLED"] = "False"

# Bytecode caches are written, by this process and every one a test starts. The suite starts
# hundreds of Python processes (shard servers, gateways, nodes, ranks, CLIs); where
# PYTHONDONTWRITEBYTECODE is set (CI's machine sets it) each compiled every module it imported
# again: about 0.2 s a start for the project's own modules alone (test_writes + test_rollout:
# median 94.7 s without their bytecode, 87.3 s with). So the README's test command installs with
# `pip install --no-compile`, and only what the suite imports is compiled, once: ~5,400 of
# site-packages' ~24,600 modules, ~22 s, where pip compiled them all in ~95 s of a ~170 s install.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False

REPO = Path(__file__).resolve().parents[1]
REPORT: list[str] = []  # filled in the xdist workers, printed by the controller
pytest_plugins = ["tests.sharing", "pytester"]


def data_dir() -> Path:
    configured = env.read("SHARDRAG_DATA_DIR")
    path = Path(configured) if configured else REPO.parent / "shared" / "data"
    if not (path / "msmarco" / "corpus.jsonl").exists():
        raise RuntimeError(f"test data not found at {path}: set SHARDRAG_DATA_DIR to the folder holding msmarco/ "
                           "and dbpedia/ (../shared/data next to the checkout)")
    return path


def pytest_sessionstart(session: pytest.Session) -> None:
    """Bytecode for the project's own modules, written once before any test (the suite's processes
    also write what else they import: see the top of this file)."""
    packages = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["root_packages"]
    for package in [*packages, "tests"]:
        compileall.compile_dir(REPO / package, quiet=1)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:  # xdist: a worker ended, with what its tests measured
    REPORT.extend(node.workeroutput.get("shardrag_report", []))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if REPORT:
        terminalreporter.section("shardrag measurements")
        for line in REPORT:
            terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def cache_dir() -> Path:
    """The embedding cache shared with the CLI, so a machine encodes each corpus once."""
    from retrieval.embedding_cache import default_cache_dir

    return default_cache_dir()


@pytest.fixture(scope="session")
def encoder(cache_dir: Path):
    from retrieval.embedding_cache import CachingEncoder, EmbeddingCache
    from retrieval.encoders import load_default_encoder

    return CachingEncoder(load_default_encoder(device="cpu"), EmbeddingCache(cache_dir))


@dataclass(frozen=True)
class EmbeddedCorpus:
    dataset: BeirDataset
    documents: list[Document]
    vectors: np.ndarray
    version: EmbeddingVersion
    query_ids: list[str]
    query_vectors: np.ndarray


def _embed(name: str, encoder) -> EmbeddedCorpus:
    from retrieval.encoders import encode_documents

    dataset = load_beir(data_dir() / name)
    vectors = encode_documents(encoder, dataset.corpus, show_progress=True)
    query_ids = sorted(dataset.queries)
    query_vectors = encoder.encode_queries([dataset.queries[q] for q in query_ids])
    return EmbeddedCorpus(dataset, dataset.corpus, vectors, encoder.version, query_ids, query_vectors)


@pytest.fixture(scope="session")
def msmarco(encoder) -> EmbeddedCorpus:
    return _embed("msmarco", encoder)


@pytest.fixture(scope="session")
def dbpedia(encoder) -> EmbeddedCorpus:
    return _embed("dbpedia", encoder)


def random_corpus(n: int = 600, dim: int = 32, seed: int = 0) -> tuple[list[Document], np.ndarray, EmbeddingVersion]:
    """Small synthetic corpus for tests that need FAISS but not the real model."""
    rng = np.random.default_rng(seed)
    vectors = rng.standard_normal((n, dim)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    documents = [Document(f"doc-{i}", f"text of document {i}", f"Title {i}" if i % 3 else "", {"i": i})
                 for i in range(n)]
    return documents, vectors, EmbeddingVersion("synthetic", "0" * 64, dim)


_PASSED = {"count": 0}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "call" and report.passed:
        _PASSED["count"] += 1


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: its measurements go to the controller
        workeroutput["shardrag_report"] = list(REPORT)
        return
    # "Green" must mean tests ran: a run where everything was skipped or deselected fails too.
    if exitstatus == 0 and _PASSED["count"] == 0:
        session.exitstatus = pytest.ExitCode.NO_TESTS_COLLECTED
