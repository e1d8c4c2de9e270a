"""An encoder worker process: ``python -m serving.encoding.worker [--device D] [--threads N]``.

Spoken to over stdin/stdout in :mod:`serving.encoding.protocol` frames (anything the libraries
print goes to stderr: fd 1 is moved there before torch is imported). torch is imported once, when
the process starts, so a new version's model later loads in a fraction of a second (a checkpoint
that needs sentence-transformers imports it on its first load, off the encoding thread). Loading
runs on a side thread and encoding on the main thread: queries of the live version keep flowing
while the next version's weights are read, and neither touches the gateway's interpreter (its event
loop never waits on the GIL for them); the side thread runs niced
(:mod:`serving.encoding.priority`), so on a busy host the load yields the CPU.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
from typing import IO, Any

from serving.encoding.priority import background_priority
from serving.encoding.protocol import read_frame, write_frame

logger = logging.getLogger("serving.encoding.worker")


class Worker:
    def __init__(self, output: IO[bytes], *, device: str, batch_size: int, runtime: str = "torch",
                 threads: int = 0) -> None:
        self._output = output
        self._write_lock = threading.Lock()
        self._device = device
        self._batch_size = batch_size
        self._runtime = runtime
        self._threads = threads
        self._encoders: dict[str, Any] = {}

    def _send(self, message: tuple[Any, ...]) -> None:
        with self._write_lock:
            write_frame(self._output, message)

    def _load(self, key: str, model: str) -> None:
        from retrieval.encoders import load_encoder

        try:
            with background_priority():  # live encodes on the main thread go first
                encoder = load_encoder(None if model == "default" else model, device=self._device,
                                       batch_size=self._batch_size, runtime=self._runtime,
                                       threads=self._threads if self._runtime != "torch" else None)
        except Exception as exc:  # noqa: BLE001 - reported to the gateway, which reports it on /healthz
            self._send(("loaded", key, None, str(exc)))
            return
        self._encoders[key] = encoder
        self._send(("loaded", key, encoder.version.to_dict(), None))

    def _encode(self, req_id: int, key: str, kind: str, texts: list[str]) -> None:
        encoder = self._encoders.get(key)
        if encoder is None:
            self._send(("vectors", req_id, None, f"no encoder loaded for {key}"))
            return
        try:
            vectors = encoder.encode_queries(texts) if kind == "query" else encoder.encode_texts(texts)
        except Exception as exc:  # noqa: BLE001 - one bad batch must not end the worker
            self._send(("vectors", req_id, None, f"{type(exc).__name__}: {exc}"))
            return
        self._send(("vectors", req_id, vectors, None))

    def serve(self, requests: IO[bytes]) -> None:
        while (message := read_frame(requests)) is not None:
            match message:
                case ("encode", int(req_id), str(key), str(kind), list(texts)):
                    self._encode(req_id, key, kind, texts)
                case ("load", str(key), str(model)):
                    threading.Thread(target=self._load, args=(key, model), name=f"load-{key}", daemon=True).start()
                case ("unload", str(key)):
                    self._encoders.pop(key, None)
                case _:
                    logger.error("unknown encoder request %r", message[:1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m serving.encoding.worker",
                                     description="An encoder worker process of a shardrag gateway (spoken to over "
                                                 "stdin/stdout frames; not meant to be run by hand).")
    parser.add_argument("--device", default="auto", help="auto (CUDA when present), cpu or cuda[:N]")
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: one per core)")
    parser.add_argument("--batch-size", type=int, default=64, help="largest batch one forward pass takes")
    parser.add_argument("--runtime", default="torch", choices=("torch", "onnx", "onnx-int8"),
                        help="what runs the model (see encoder.runtime in the gateway config)")
    args = parser.parse_args(argv)
    # The protocol owns the real stdout; whatever torch, tqdm or a model prints goes to stderr.
    output = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format=f"encoder-worker[{os.getpid()}] %(levelname)s %(message)s")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch  # once, at start: every later model load skips the import

    torch.set_num_threads(args.threads or len(os.sched_getaffinity(0)))
    # sentence-transformers is not imported here: the default model runs on plain torch
    # (retrieval.bert_encoder); a checkpoint that needs it imports it when it loads.

    worker = Worker(output, device=args.device, batch_size=args.batch_size, runtime=args.runtime,
                    threads=args.threads or len(os.sched_getaffinity(0)))
    try:
        worker.serve(sys.stdin.buffer)
    except (BrokenPipeError, KeyboardInterrupt):
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
