"""Imports point one way (DESIGN.md §2), the light core stays light, and the rooms of serving/
stay small. import-linter (pyproject.toml, run by .ci/run and by the last test here) checks the
same layers transitively and forbids cycles between the rooms of serving/."""

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("retrieval", "httpkit", "clusterstate", "index_shards", "serving", "training")
HEAVY = ("torch", "faiss", "fastapi", "uvicorn", "httpx", "aiohttp", "starlette", "sentence_transformers",
         "transformers", "Stemmer", "pypdf", "opentelemetry")
WEB_FRAMEWORKS = ("fastapi", "starlette", "uvicorn")

# package → packages it may import
ALLOWED = {
    "retrieval": set(),
    "httpkit": {"retrieval"},
    "clusterstate": {"retrieval"},
    "index_shards": {"retrieval", "httpkit", "clusterstate"},
    "serving": {"retrieval", "httpkit", "clusterstate", "index_shards"},
    "training": {"retrieval", "index_shards"},
}
# serving may touch index_shards only to embed shards in-process, launch or build them
SERVING_USING_INDEX_SHARDS = ("serving/transport/inprocess.py", "serving/transport/ray.py",
                              "serving/transport/ray_replica.py", "serving/transport/ray_node.py", "serving/local/",
                              "serving/cli/")
MAX_SERVING_MODULE_LINES = 350


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
        relative = path.relative_to(REPO).as_posix()
        imported = imports_of(path) & set(PACKAGES) - {package}
        forbidden = imported - ALLOWED[package]
        assert not forbidden, f"{relative} imports {sorted(forbidden)}"
        if package == "serving" and "index_shards" in imported:
            assert relative.startswith(SERVING_USING_INDEX_SHARDS), \
                f"{relative} imports index_shards; only {SERVING_USING_INDEX_SHARDS} may"


def test_the_core_never_imports_a_web_framework_at_any_depth():
    for path in sorted((REPO / "retrieval").rglob("*.py")):
        web = imports_of(path) & set(WEB_FRAMEWORKS)  # inside functions too
        assert not web, f"{path.relative_to(REPO)} imports {sorted(web)}: server code belongs in httpkit/"


def test_retrieval_modules_import_no_heavy_library_at_top_level():
    for path in sorted((REPO / "retrieval").rglob("*.py")):
        heavy = imports_of(path, top_level_only=True) & set(HEAVY)
        assert not heavy, f"{path.relative_to(REPO)} imports {sorted(heavy)} at module level"


def test_importing_the_core_loads_no_heavy_library():
    modules = [f"retrieval.{p.stem}" for p in sorted((REPO / "retrieval").glob("*.py")) if p.stem != "__init__"]
    code = (f"import sys, retrieval, {', '.join(modules)}; "
            f"print(' '.join(m for m in {HEAVY!r} if m in sys.modules))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert loaded == []


def test_shard_server_never_imports_torch():
    code = "import sys, index_shards.__main__, index_shards.server; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip() == "False"


def test_no_serving_module_is_over_the_size_limit():
    long = {path.relative_to(REPO).as_posix(): n for path in (REPO / "serving").rglob("*.py")
            if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_SERVING_MODULE_LINES}
    assert not long, f"split these (over {MAX_SERVING_MODULE_LINES} lines): {long}"


def test_every_package_says_what_it_holds_and_may_import():
    for init in [REPO / p / "__init__.py" for p in PACKAGES] + sorted((REPO / "serving").glob("*/__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or ""
        assert "import" in doc.lower() and len(doc) > 80, f"{init.relative_to(REPO)}: say what it holds and imports"


def test_import_linter_contracts_hold():
    lint_imports = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    if lint_imports is None:
        pytest.fail("lint-imports is not installed (it is in the dev extra)")
    result = subprocess.run([lint_imports, "--no-cache"], capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
