"""A GPU host's model version: the analysis's (`shared.model_version`) and the host's own inputs.

Beside the analysis's data files, what else decides a host's answers: the BiSeNet weights
when `gpu_host.bisenet_weights` names them (they replace the hair network), and the ComfyUI
workflow when `gpu_host.comfyui_url` is set (it draws the grown images). Both are hashed by
content, not by path: the same weights at another path are the same version. Computed once,
in the web process, before the port opens (`gpu_host.main.serve`); reported in `/health`
and on every answer (`X-Model-Version`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from shared.model_version import ModelVersion, analysis_inputs, compose, file_sha256, json_sha256

BISENET_INPUT = "gpu_host.bisenet_weights"
WORKFLOW_INPUT = "gpu_host.comfyui_workflow"


def host_model_version(bisenet_weights: str, workflow: Mapping[str, Any] | None) -> ModelVersion:
    """`workflow`: the ComfyUI graph the host draws with, None when it draws no ComfyUI picture."""
    inputs = analysis_inputs()
    if bisenet_weights:
        inputs[BISENET_INPUT] = file_sha256(Path(bisenet_weights))
    if workflow is not None:
        inputs[WORKFLOW_INPUT] = json_sha256(workflow)
    return compose(inputs)
