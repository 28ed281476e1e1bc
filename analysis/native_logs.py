"""Keep MediaPipe's native start-up chatter off stderr; let real warnings and errors through.

MediaPipe 0.10.21's C++ side logs through absl and TensorFlow Lite's own logger, and neither
reads an environment variable (GLOG_minloglevel and TF_CPP_MIN_LOG_LEVEL were tried: no
effect) nor is reachable from Python. Both write straight to file descriptor 2, so the only
lever is that descriptor: `quiet_native_logs()` points fd 2 at a pipe whose reader drops the
known chatter lines and copies every other byte to the original stderr. Call it before
mediapipe is imported (the detector and the segmenter do); it acts once per process.

Dropped: TFLite's "INFO:" lines, absl's pre-initialisation banner, absl INFO lines, and the
warnings MediaPipe prints on every start (`CHATTER_WARNINGS`). Anything else, absl
warnings from other sources, errors (E/F lines) and Python's own output, passes unchanged.
"""

from __future__ import annotations

import atexit
import fcntl
import os
import re
import threading

CHATTER_WARNINGS = ("inference_feedback_manager.cc", "landmark_projection_calculator.cc")
_CHATTER = re.compile(
    rb"^(INFO: |WARNING: All log messages before absl::InitializeLog\(\)|I\d{4} "
    rb"|W\d{4} \S+\s+\d+ (" + b"|".join(re.escape(name.encode()) for name in CHATTER_WARNINGS) + rb"):)"
)
_STDERR_FD = 2
_PIPE_BYTES = 1 << 20

_lock = threading.Lock()
_installed = False


def is_chatter(line: bytes) -> bool:
    return _CHATTER.match(line) is not None


def quiet_native_logs() -> None:
    """Filter fd 2 from now on (idempotent)."""
    global _installed
    with _lock:
        if _installed:
            return
        _installed = True
        original = os.dup(_STDERR_FD)
        read_end, write_end = os.pipe()
        # A native call that holds the GIL while it logs cannot wait for the reader thread:
        # room for far more than a burst of log lines.
        fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, _PIPE_BYTES)
        os.dup2(write_end, _STDERR_FD)
        os.close(write_end)
        ours = _identity(_STDERR_FD)
        reader = threading.Thread(target=_forward, args=(read_end, original), name="native-log-filter", daemon=True)
        reader.start()

    def drain() -> None:
        # A last traceback is written before atexit runs: restore fd 2, which closes the
        # pipe's last write end, and let the reader copy what is still in it. Unless someone
        # (pytest's capture) has pointed fd 2 elsewhere since: then the pipe is closed already.
        if _identity(_STDERR_FD) == ours:
            os.dup2(original, _STDERR_FD)
        reader.join(timeout=2.0)

    atexit.register(drain)


def _identity(fd: int) -> tuple[int, int]:
    status = os.fstat(fd)
    return status.st_dev, status.st_ino


def _forward(read_end: int, original: int) -> None:
    pending = b""
    with os.fdopen(read_end, "rb", buffering=0) as pipe:
        while chunk := pipe.read(65536):
            *lines, pending = (pending + chunk).split(b"\n")
            _write(original, b"".join(line + b"\n" for line in lines if not is_chatter(line)))
    if pending and not is_chatter(pending):
        _write(original, pending)


def _write(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
