"""The keys of the gateway <-> GPU host hop that clients never see: `/health`'s, the busy
answer's, and the web process <-> model child options."""

# A GPU host already running a job answers 503 with `MSG_HOST_BUSY` and this key true.
BUSY_KEY = "busy"
# A GPU host's `/health` (gpu_host.md § Health), read by every gateway's prober: a host still
# loading its models answers 503 with this status; `checks` maps each deep check to its state.
HEALTH_LOADING = "loading"
HEALTH_CHECKS_KEY = "checks"
# Several gateways without shared state (gateway.md § Several gateways): a gateway whose
# request has waited long for a host another one keeps busy says so on its probe
# (`HEADER_HOST_WANTED: 1`); while a job runs, the host's `/health` then says
# `"wanted": true` for `HOST_WANTED_SECONDS`, and the gateway whose job it is lets the host
# go when that job ends. Only the host sees who asks for it.
WANTED_KEY = "wanted"
HOST_WANTED_SECONDS = 1.5
CHECK_DISK, CHECK_COMFYUI = "disk", "comfyui"
CHECK_OK, CHECK_LOW, CHECK_DOWN, CHECK_OFF = "ok", "low", "down", "off"
# The model version (`shared.contract.headers.HEADER_MODEL_VERSION`) in a host's `/health`.
MODEL_VERSION_KEY = "model_version"
# Between the GPU host's web process and its model process only (`parse_options` never
# sets it, so no client can): with ComfyUI configured the host sets this option, and each
# grow result (and the mark answer) then carries its inpainting mask, a base64 PNG, under
# INPAINT_MASK_KEY instead of a preview. The key does not end in `_base64`, so the gateway
# would never publish it; the host removes it before answering (gpu_host.comfyui).
INPAINT_MASK_OPTION = "inpaint_masks"
INPAINT_MASK_KEY = "inpaint_mask_png"
