"""Imports point one way (DESIGN.md §2), and the light core stays light."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("retrieval", "index_shards", "serving", "training")
HEAVY = ("torch", "faiss", "fastapi", "uvicorn", "httpx", "aiohttp", "starlette", "sentence_transformers", "transformers")

# package → packages it may import
ALLOWED = {
    "retrieval": set(),
    "index_shards": {"retrieval"},
    "serving": {"retrieval", "index_shards"},
    "training": {"retrieval", "index_shards"},
}
# serving may touch index_shards only to embed shards in-process, launch or build them
SERVING_MODULES_USING_INDEX_SHARDS = {"embedded.py", "launcher.py", "cli.py", "ray_backend.py"}


def imports_of(path: Path, *, top_level_only: bool = False) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    found = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


@pytest.mark.parametrize("package", PACKAGES)
def test_packages_import_in_one_direction(package):
    for path in sorted((REPO / package).rglob("*.py")):
        imported = imports_of(path) & set(PACKAGES) - {package}
        forbidden = imported - ALLOWED[package]
        assert not forbidden, f"{path.relative_to(REPO)} imports {sorted(forbidden)}"
        if package == "serving" and "index_shards" in imported:
            assert path.name in SERVING_MODULES_USING_INDEX_SHARDS, \
                f"{path.relative_to(REPO)} imports index_shards; only {sorted(SERVING_MODULES_USING_INDEX_SHARDS)} may"


def test_retrieval_modules_import_no_heavy_library_at_top_level():
    for path in sorted((REPO / "retrieval").rglob("*.py")):
        heavy = imports_of(path, top_level_only=True) & set(HEAVY)
        assert not heavy, f"{path.relative_to(REPO)} imports {sorted(heavy)} at module level"


def test_importing_the_core_loads_no_heavy_library():
    code = ("import sys, retrieval, retrieval.client, retrieval.encoders, retrieval.embedding_cache, "
            "retrieval.datasets, retrieval.ir_metrics, retrieval.serve, retrieval.wire, retrieval.routing; "
            f"print(' '.join(m for m in {HEAVY!r} if m in sys.modules))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert loaded == []


def test_shard_server_never_imports_torch():
    code = "import sys, index_shards.__main__, index_shards.server; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip() == "False"
