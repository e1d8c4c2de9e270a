"""README's two commands are the ones CI runs, and the CLI/API it documents exist."""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def bash_blocks(text: str) -> list[str]:
    return [block.strip() for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S)]


def test_two_commands_and_ci_runs_the_test_one():
    readme = (REPO / "README.md").read_text()
    section = readme.split("## Two commands", 1)[1].split("\n## ", 1)[0]
    install_and_demo, install_and_test = bash_blocks(section)
    # everything through the lock file (the test command without pip's byte-compiling: tests/conftest.py)
    assert "pip install -r requirements/dev.lock" in install_and_demo
    assert "pip install --no-compile -r requirements/dev.lock" in install_and_test
    assert install_and_demo.endswith("shardrag demo") and install_and_test.endswith("python -m pytest")
    ci = (REPO / ".ci" / "run").read_text()
    assert install_and_test in ci.splitlines(), ".ci/run must run README's test command verbatim"
    for check in ("ruff check", "mypy", "lint-imports"):
        assert check in ci, f".ci/run must run {check}"


def test_the_lock_pins_every_dependency_and_torch_to_its_cpu_build():
    lock = (REPO / "requirements" / "dev.lock").read_text()
    pins = dict(line.split("==", 1) for line in lock.splitlines() if "==" in line and not line.startswith("#"))
    assert pins["torch"].endswith("+cpu")
    assert not any(name.startswith(("nvidia-", "triton")) for name in pins)  # no CUDA build sneaked in
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    wanted = project["dependencies"] + project["optional-dependencies"]["dev"] + \
        project["optional-dependencies"]["answer"]
    names = {re.split(r"[<>=\[; ]", spec, maxsplit=1)[0].lower() for spec in wanted if not spec.startswith("shardrag")}
    assert names <= {n.lower() for n in pins}, sorted(names - {n.lower() for n in pins})


def test_documented_subcommands_exist():
    from serving.cli import build_parser

    parser = build_parser()
    subcommands = parser._subparsers._group_actions[0].choices  # noqa: SLF001 - argparse has no public accessor
    cli_section = (REPO / "README.md").read_text().split("## CLI", 1)[1].split("\n## ", 1)[0]
    documented = re.findall(r"^shardrag ([a-z-]+) ", cli_section, flags=re.M)
    assert set(documented) == set(subcommands)
