"""One supervised child process of the local cluster: started with a command line built from
its port, its stdout pumped into its log while the ``SHARDRAG_READY`` line is picked out, waited
for with a deadline (failing fast, with the log's tail, when it exits first), stopped with
terminate → wait → kill."""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from httpkit.serve import parse_ready_line
from retrieval.errors import ShardragError


class LaunchError(ShardragError):
    code = "launch_failed"


@dataclass(slots=True)
class Child:
    name: str
    make_argv: Callable[[int], list[str]]  # port → command line
    log_path: Path
    port: int = 0
    process: subprocess.Popen[str] | None = None
    ready: dict[str, Any] | None = None
    url: str | None = None  # kept across restarts (same port, same URL), unlike ``ready``
    restarts: int = 0
    last_exit_code: int | None = None
    last_restart_at: float | None = None  # wall-clock time of the last restart
    last_start: float = 0.0
    backoff_s: float = 1.0
    _ready_event: threading.Event = field(default_factory=threading.Event)

    def start(self, env: dict[str, str]) -> None:
        self._ready_event.clear()
        self.ready = None
        log = self.log_path.open("a", encoding="utf-8")
        log.write(f"--- start {time.strftime('%H:%M:%S')} port={self.port}\n")
        log.flush()
        self.process = subprocess.Popen(
            self.make_argv(self.port), stdout=subprocess.PIPE, stderr=log, text=True, env=env,
            start_new_session=True,  # Ctrl-C reaches the launcher, which stops children in order
        )
        self.last_start = time.monotonic()
        threading.Thread(target=self._pump, args=(self.process, log), daemon=True, name=f"log-{self.name}").start()

    def _pump(self, process: subprocess.Popen[str], log: Any) -> None:
        assert process.stdout is not None
        for line in process.stdout:
            payload = parse_ready_line(line) if self.ready is None else None
            if payload is not None:
                self.ready = payload
                self.url = str(payload["url"])
                self.port = int(payload["port"])
                self._ready_event.set()
            log.write(line)
            log.flush()
        log.close()

    def wait_ready(self, deadline: float) -> dict[str, Any]:
        while not self._ready_event.wait(0.05):
            assert self.process is not None
            if self.process.poll() is not None:
                raise LaunchError(f"{self.name} exited with code {self.process.returncode} before it was ready:\n"
                                  f"{self.log_tail()}")
            if time.monotonic() > deadline:
                raise LaunchError(f"{self.name} was not ready in time:\n{self.log_tail()}")
        assert self.ready is not None
        return self.ready

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self, timeout_s: float = 10.0) -> None:
        stop_all([self], timeout_s)

    def _terminate(self) -> subprocess.Popen[str] | None:
        """SIGTERM once (a second one makes uvicorn skip its graceful shutdown): the running process."""
        process = self.process
        if process is None or process.poll() is not None:
            return None
        process.terminate()
        return process


def stop_all(children: list[Child], timeout_s: float = 10.0) -> None:
    """Stop ``children`` together: each is sent SIGTERM, then each is waited for (killed when it has
    not exited within ``timeout_s``). A graceful stop takes a server ~0.2 s; one after another, a
    cluster of a gateway and 2 × 3 replicas took over a second to stop."""
    running = [(child, process) for child in children if (process := child._terminate()) is not None]
    deadline = time.monotonic() + timeout_s
    for _child, process in running:
        try:
            process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)
