"""A model child for tests: the real pipe protocol and loop, scripted instead of real models.

It runs the real `answer_requests` loop (so exception -> Failure conversion is the real code);
only the per-request work is scripted, by the image bytes the test uploads:

    b"crash"               the child SIGKILLs itself mid-request
    b"hang"                never answers (inference timeout)
    b"raise"               an unexpected exception inside the analysis
    b"fail:<code>"         a contract failure with that code
    b"unencodable"         a Result whose data cannot be JSON-encoded (a bug in the analysis)
    b"block:<in>:<out>"    write the pid to FIFO <in>, then wait for a line on FIFO <out>
    anything else          a Result describing what arrived

Load behaviour comes from `ChildConfig.extra`: {"load": "fail"} sends LoadFailed,
{"load": "exit"} dies before Ready, {"load_gate": "<fifo>"} waits for a line on that FIFO
before Ready.
"""

from __future__ import annotations

import os
import signal
import threading
from multiprocessing.connection import Connection
from typing import Any

from gpu_host.child import answer_requests, prepare_child_process
from gpu_host.protocol import ChildConfig, Infer, LoadFailed, Ready
from shared.contract import Code, ContractError

FAKE_DEVICE = "cpu"
FAKE_SEGMENTER = "fake"


def serve(conn: Connection, config: ChildConfig) -> None:
    prepare_child_process()
    load = config.extra.get("load")
    if load == "fail":
        conn.send(LoadFailed(message="FileNotFoundError: weights file not found: /nope/79999_iter.pth"))
        return
    if load == "exit":
        os._exit(3)
    if "load_gate" in config.extra:
        with open(config.extra["load_gate"]) as gate:
            gate.readline()
    conn.send(Ready(device=FAKE_DEVICE, segmenter=FAKE_SEGMENTER))
    answer_requests(conn, _handle)


def _handle(message: Infer) -> dict[str, Any]:
    command = message.image
    if command == b"crash":
        os.kill(os.getpid(), signal.SIGKILL)
    if command == b"hang":
        threading.Event().wait()
    if command == b"raise":
        raise RuntimeError("boom: a bug in the analysis")
    if command == b"unencodable":
        return {"landmarks": {1, 2, 3}}  # crosses the pipe (pickle), but is not JSON
    if command.startswith(b"fail:"):
        raise ContractError(Code(int(command[5:])), "scripted failure")
    if command.startswith(b"block:"):
        entered, release = command[6:].decode().split(":")
        with open(entered, "w") as signal_entered:
            signal_entered.write(f"{os.getpid()}\n")
        with open(release) as wait_release:
            wait_release.readline()
    return {
        "endpoint": message.endpoint,
        "image_bytes": len(message.image),
        "options": message.options,
        "request_id": message.request_id,
        "pid": os.getpid(),
    }
