"""The non-image fields of each business endpoint, as the analysis takes them.

The rules are the models' (`shared.models`); this module keeps the entry point the analysis,
its CLI and the scripts call with fields spelt as text or as JSON values, and the options
that only the GPU host sets. Pure on purpose (no numpy, torch or mediapipe): the gateway and
the GPU host's web process import it.
"""

from __future__ import annotations

from typing import Any

from shared.models import (  # noqa: F401 (re-exported: the contract's choices and limits)
    ENDPOINTS,
    GENDERS,
    MAX_DROP_MM,
    MAX_HAIRLINE_POINTS,
    MIN_HAIRLINE_POINTS,
    PLANS,
    STYLES,
    validate_form,
)

# The endpoints whose answers carry grown images (`grown_image_base64` + `generator`).
GENERATING_ENDPOINTS = ("grow", "mark")
# Between the GPU host's web process and its model process only (`parse_options` never
# sets it, so no client can): with ComfyUI configured the host sets this option, and each
# grow result (and the mark answer) then carries its inpainting mask, a base64 PNG, under
# INPAINT_MASK_KEY instead of a preview. The key does not end in `_base64`, so the gateway
# would never publish it; the host removes it before answering (gpu_host.comfyui).
INPAINT_MASK_OPTION = "inpaint_masks"
INPAINT_MASK_KEY = "inpaint_mask_png"


def parse_options(endpoint: str, fields: Any) -> dict[str, Any]:
    """The validated options of `endpoint` from form-style fields (text, or JSON values);
    raises ContractError(1001) naming the bad field, ValueError for an unknown endpoint.

    measure -> {"gender"}; grow -> {"plans", "gender"}; mark -> {"hairline_points",
    "drop_mm"} (one of them None); hairline -> {"styles", "gender"}; mask,
    special-points, features -> {}. `gender` on grow and hairline is an optional extension
    of contract.md: the design heights depend on it (analysis.md § Designs).
    """
    return validate_form(endpoint, fields)
