"""The stderr filter in a real process: chatter lines dropped, everything else kept, in order,
including what is written just before the process exits."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from analysis.native_logs import is_chatter

REPO = Path(__file__).resolve().parents[2]

CHATTER = [
    b"INFO: Created TensorFlow Lite XNNPACK delegate for CPU.",
    b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
    b"I0000 00:00:1796093720.675558    5093 gl_context.cc:369] GL version: 3.2",
    b"W0000 00:00:1796093720.675558    5093 inference_feedback_manager.cc:114] Feedback manager requires a model",
    b"W0000 00:00:1796093720.844499    5093 landmark_projection_calculator.cc:186] Using NORM_RECT without",
]
KEPT = [
    b"E0000 00:00:1796093720.844499    5093 calculator_graph.cc:887] a real error",
    b"W0000 00:00:1796093720.844499    5093 tflite_model_loader.cc:1] an unknown warning",
    b"Traceback (most recent call last):",
    b"WARNING: something else",
]


def test_known_chatter_is_recognised_and_nothing_else() -> None:
    assert all(is_chatter(line) for line in CHATTER)
    assert not any(is_chatter(line) for line in KEPT)


def test_a_process_keeps_real_lines_in_order_up_to_its_exit() -> None:
    interleaved = b"".join(line + b"\n" for pair in zip(CHATTER, KEPT, strict=False) for line in pair)
    script = (
        "import os, sys\n"
        "from analysis.native_logs import quiet_native_logs\n"
        "quiet_native_logs(); quiet_native_logs()\n"
        f"os.write(2, {interleaved!r})\n"
        "sys.exit('last words')\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, cwd=REPO, timeout=30)
    assert result.returncode == 1
    assert result.stderr == b"".join(line + b"\n" for line in KEPT) + b"last words\n"
