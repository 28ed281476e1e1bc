"""A model child for tests: the real pipe protocol and loop, scripted instead of real models.

It runs the real `answer_requests` loop (so exception -> Failure conversion is the real code);
only the per-request work is scripted, by the image bytes the test uploads (after
`SIGNATURE`, which a test puts first with `scripted()` so that the host's magic-byte check
lets the script through; it is stripped here):

    b"crash"               the child SIGKILLs itself mid-request
    b"hang"                never answers (inference timeout)
    b"raise"               an unexpected exception inside the analysis
    b"fail:<code>"         the analysis refuses the photo: the kind answered with that code
    b"kind:<error_type>"   what a GPU raises for that kind (`gpu_host.failure_kinds`), e.g. kind:cuda_oom
    b"unencodable"         a Result whose data cannot be JSON-encoded (a bug in the analysis)
    b"block:<in>:<out>"    write the pid to FIFO <in>, then wait for a line on FIFO <out>
    anything else          a Result describing what arrived; grow and mark add their grown
                           images (see `_grown`)

Load behaviour comes from `ChildConfig.extra`: {"load": "fail"} sends LoadFailed,
{"load": "exit"} dies before Ready, {"load_gate": "<fifo>"} waits for a line on that FIFO
before Ready.
"""

from __future__ import annotations

import base64
import io
import os
import signal
import threading
from multiprocessing.connection import Connection
from typing import Any

from PIL import Image

from analysis.errors import AnalysisError
from gpu_host.child import answer_requests, prepare_child_process
from gpu_host.failure_kinds import simulated_exception
from gpu_host.protocol import ChildConfig, Infer, LoadFailed, Ready
from shared.contract import GENERATOR_PREVIEW, REFUSAL_CODES, Code, ErrorType
from shared.contract.hop import INPAINT_MASK_KEY, INPAINT_MASK_OPTION

FAKE_DEVICE = "cpu"
FAKE_SEGMENTER = "fake"
SIGNATURE = b"\x89PNG\r\n\x1a\n"


def scripted(command: bytes) -> bytes:
    """An upload the host takes for a PNG and this child reads as `command`."""
    return SIGNATURE + command


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
    command = message.image.removeprefix(SIGNATURE)
    if command == b"crash":
        os.kill(os.getpid(), signal.SIGKILL)
    if command == b"hang":
        threading.Event().wait()
    if command == b"raise":
        raise RuntimeError("boom: a bug in the analysis")
    if command == b"unencodable":
        return {"landmarks": {1, 2, 3}}  # crosses the pipe (pickle), but is not JSON
    if command.startswith(b"kind:"):
        raise simulated_exception(ErrorType(command[5:].decode()))
    if command.startswith(b"fail:"):
        code = Code(int(command[5:]))
        raise AnalysisError(next(kind for kind, its in REFUSAL_CODES.items() if its is code), "scripted failure")
    if command.startswith(b"block:"):
        entered, release = command[6:].decode().split(":")
        with open(entered, "w") as signal_entered:
            signal_entered.write(f"{os.getpid()}\n")
        with open(release) as wait_release:
            wait_release.readline()
    described = {
        "endpoint": message.endpoint,
        "image_bytes": len(message.image),
        "options": message.options,
        "request_id": message.request_id,
        "pid": os.getpid(),
    }
    if message.endpoint == "grow":
        return {**described, "results": [{"plan": plan, **_grown(message)} for plan in message.options["plans"]]}
    if message.endpoint == "mark":
        return {**described, **_grown(message)}
    return described


def _grown(message: Infer) -> dict[str, Any]:
    """What the real child answers per grown image. The "preview" is the upload itself;
    asked for inpainting masks, a photo gets a white band across rows [h/8, h/4) (above
    any brows), and bytes that are no picture count as a photo with no hair to grow from."""
    if not message.options.get(INPAINT_MASK_OPTION):
        return {"grown_image_base64": base64.b64encode(message.image).decode(), "generator": GENERATOR_PREVIEW}
    try:
        width, height = Image.open(io.BytesIO(message.image)).size
    except OSError:
        return {"grown_image_base64": None, "generator": None}
    mask = Image.new("L", (width, height), 0)
    mask.paste(255, (0, height // 8, width, height // 4))
    buffer = io.BytesIO()
    mask.save(buffer, format="PNG")
    return {
        "grown_image_base64": None,
        "generator": None,
        INPAINT_MASK_KEY: base64.b64encode(buffer.getvalue()).decode(),
    }
