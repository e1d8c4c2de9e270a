"""The command runner's exit convention: a request no server answered is one ``error:`` line and
exit 2, like every other refusal; any other unexpected error still raises."""

import argparse
import socket

import httpx
import pytest

from retrieval.cli_support import EXIT_ERROR, run_command
from retrieval.errors import ConfigError


def closed_port() -> int:
    with socket.socket() as sock:  # bound, never listening: a connection is refused
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def command(func) -> argparse.Namespace:
    return argparse.Namespace(func=func)


def test_a_refused_connection_is_one_error_line(capsys):
    url = f"http://127.0.0.1:{closed_port()}/v1/query"

    def ask(_args):
        httpx.post(url, json={"text": "x"}, timeout=5)

    assert run_command(command(ask)) == EXIT_ERROR
    err = capsys.readouterr().err
    assert err.startswith(f"error: no answer from POST {url}: ") and err.count("\n") == 1


def test_refusals_keep_their_message_and_other_errors_still_raise(capsys):
    def refuse(_args):
        raise ConfigError("bad flag", field="x")

    assert run_command(command(refuse)) == EXIT_ERROR
    assert capsys.readouterr().err == "error: bad flag\n"

    def broken(_args):
        raise ValueError("a bug")

    with pytest.raises(ValueError):
        run_command(command(broken))
