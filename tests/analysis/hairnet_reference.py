"""Writes `data/hairnet_litert_reference.npz`: what LiteRT (the TFLite runtime, XNNPACK)
computes for the bundled hair network, the reference `test_hairnet.py` holds the torch port to.

    pip install --target /tmp/litert ai-edge-litert   # test-only, not a project dependency
    PYTHONPATH=/tmp/litert python tests/analysis/hairnet_reference.py

Inputs: the astronaut (512×512, scikit-image) and a seeded uniform-noise image, as RGB / 255
with a zero fourth channel. Stored: the logits on every `STRIDE`-th row and column.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
MODEL = HERE.parents[1] / "analysis" / "data" / "hair_segmentation.tflite"
REFERENCE = HERE / "data" / "hairnet_litert_reference.npz"
STRIDE = 8


def reference_inputs() -> dict[str, np.ndarray]:
    """[512, 512, 4] float32 network inputs by name (also built by the test)."""
    from skimage import data

    noise = np.random.default_rng(17).integers(0, 256, (512, 512, 3), dtype=np.uint8)
    inputs = {}
    for name, rgb in (("astronaut", data.astronaut()), ("noise", noise)):
        x = np.zeros((512, 512, 4), np.float32)
        x[..., :3] = rgb.astype(np.float32) / 255.0
        inputs[name] = x
    return inputs


def main() -> None:
    from ai_edge_litert.interpreter import Interpreter  # type: ignore[import-not-found]  # test-only, not installed

    interpreter = Interpreter(model_path=str(MODEL))
    interpreter.allocate_tensors()
    (source,), (target,) = interpreter.get_input_details(), interpreter.get_output_details()
    logits = {}
    for name, x in reference_inputs().items():
        interpreter.set_tensor(source["index"], x[None])
        interpreter.invoke()
        logits[name] = interpreter.get_tensor(target["index"])[0, ::STRIDE, ::STRIDE].astype(np.float32)
    np.savez_compressed(REFERENCE, **logits)
    print(f"wrote {REFERENCE}: {', '.join(f'{k} {v.shape}' for k, v in logits.items())}")


if __name__ == "__main__":
    main()
