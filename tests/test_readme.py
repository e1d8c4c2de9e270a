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
    assert "pip install torch==2.13.0" in install_and_demo and install_and_demo.endswith("shardrag demo")
    assert "pip install torch==2.13.0" in install_and_test and "pytest" in install_and_test
    ci = (REPO / ".ci" / "run").read_text()
    assert install_and_test in ci.splitlines(), ".ci/run must run README's test command verbatim"


def test_documented_subcommands_exist():
    from serving.cli import build_parser

    parser = build_parser()
    subcommands = parser._subparsers._group_actions[0].choices  # noqa: SLF001 - argparse has no public accessor
    cli_section = (REPO / "README.md").read_text().split("## CLI", 1)[1].split("\n## ", 1)[0]
    documented = re.findall(r"^shardrag ([a-z-]+) ", cli_section, flags=re.M)
    assert set(documented) == set(subcommands)
