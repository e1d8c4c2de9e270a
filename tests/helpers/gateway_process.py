"""A gateway process of its own (``shardrag gateway --cluster SPEC``) beside a launched cluster:
several gateways over one cluster state, as deployed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path


class Gateway:
    """An extra gateway process (``shardrag gateway``) over the launcher's cluster spec, restarted on
    an empty working directory (under ``homes``, the test's own temporary folder) each time."""

    def __init__(self, spec: Path, log: Path, homes: Path) -> None:
        self.spec, self.log, self.homes = spec, log, homes
        self.process: subprocess.Popen[str] | None = None
        self.url = ""

    def start(self) -> None:
        self.homes.mkdir(parents=True, exist_ok=True)
        home = tempfile.mkdtemp(prefix="gateway-home-", dir=self.homes)  # an empty disk: nothing of the last one
        environment = {**os.environ, "HOME": home, "TMPDIR": home}
        with open(self.log, "a") as log:
            self.process = subprocess.Popen([sys.executable, "-m", "serving", "gateway", "--cluster", str(self.spec),
                                             "--port", "0"], stdout=subprocess.PIPE, stderr=log, text=True,
                                            env=environment, cwd=home)
        line = self.process.stdout.readline()
        assert line.startswith("SHARDRAG_READY "), Path(self.log).read_text()[-3000:]
        self.url = json.loads(line.split(" ", 1)[1])["url"]

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()
