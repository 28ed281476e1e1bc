"""The ComfyUI client of the GPU host's web process (gpu_host.md § Generation).

It speaks ComfyUI's own HTTP API (the routes of ComfyUI's `server.py`; docs/generation.md
says which versions): `POST /upload/image` for the photo and each inpainting mask, `POST
/prompt` with the workflow's placeholders filled, `GET /history/{prompt_id}` polled until
the prompt has outputs, `GET /view` for the first output image. A prompt that is not done
within `comfyui_timeout_seconds` is interrupted (`POST /interrupt` naming it: ComfyUI
versions that know the field stop only that prompt, older ones stop what runs) and
dropped from the queue (`POST /queue {"delete": [id]}`).

Every failure (ComfyUI down, an HTTP error, a failed or too slow prompt, no image in the
outputs) is a `None` for that plan: the caller answers `grown_image_url: null` with
`generator: null`. The reason is logged at most once a minute, not per request.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import re
import uuid
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

import httpx
import trio

from shared.contract import GENERATOR_COMFYUI
from shared.contract.hop import INPAINT_MASK_KEY
from shared.logs import FailureLog
from shared.settings import SettingsError

log = logging.getLogger("gpu_host.comfyui")

WORKFLOW_KEY = "gpu_host.comfyui_workflow"
DEFAULT_WORKFLOW = "sd15_inpaint.json"
PLACEHOLDERS = ("image", "mask", "prompt", "negative_prompt", "seed")
REQUIRED_PLACEHOLDERS = ("image", "mask")
_PLACEHOLDER = re.compile(r"^\{\{([a-z_]+)\}\}$")

PROMPT = (
    "close-up photo of the same person, natural dense hair growing down to a lower frontal hairline, "
    "same hair colour and texture as the rest of the hair, realistic, sharp focus"
)
NEGATIVE_PROMPT = "hat, cap, bald, wig, fringe over the eyes, painting, cartoon, blurry, text, watermark, deformed"

POLL_SECONDS = 0.5
REQUEST_TIMEOUT_SECONDS = 30.0  # one HTTP exchange; the whole prompt has comfyui_timeout_seconds
PROBE_TIMEOUT_SECONDS = 3.0  # GET /system_stats for /health's checks.comfyui
CLEANUP_TIMEOUT_SECONDS = 5.0
FAILURE_LOG_INTERVAL_SECONDS = 60.0
SEED_BITS = 48  # KSampler takes up to 2**64 - 1; 48 bits stay exact in every JSON reader


class ComfyUIFailure(Exception):
    """One prompt could not be drawn; the message says why (it is logged, never returned)."""


def load_workflow(path: str) -> dict[str, Any]:
    """The workflow in ComfyUI's API format (node id -> {class_type, inputs}): the file at
    `path`, or the packaged SD-1.5 inpainting graph when `path` is empty.

    SettingsError naming `gpu_host.comfyui_workflow` when the file cannot be read, is not
    an API-format graph, lacks `{{image}}` or `{{mask}}`, or names an unknown placeholder."""
    try:
        if path:
            text = Path(path).read_text(encoding="utf-8")
        else:
            text = resources.files("gpu_host").joinpath("workflows", DEFAULT_WORKFLOW).read_text(encoding="utf-8")
        workflow = json.loads(text)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise SettingsError(f"{WORKFLOW_KEY}: cannot read a JSON workflow from {path!r}: {error}") from None
    if not isinstance(workflow, dict) or not all(
        isinstance(node, dict) and "class_type" in node and isinstance(node.get("inputs"), dict)
        for node in workflow.values()
    ):
        raise SettingsError(
            f"{WORKFLOW_KEY}: {path!r} is not in ComfyUI's API format (node id -> {{class_type, inputs}}); "
            "export it with 'Save (API Format)'"
        )
    found = placeholders_in(workflow)
    unknown = sorted(found - set(PLACEHOLDERS))
    if unknown:
        raise SettingsError(f"{WORKFLOW_KEY}: unknown placeholder(s) {unknown}; known: {list(PLACEHOLDERS)}")
    missing = [name for name in REQUIRED_PLACEHOLDERS if name not in found]
    if missing:
        names = ", ".join("{{" + name + "}}" for name in missing)
        raise SettingsError(f"{WORKFLOW_KEY}: the workflow has no {names} placeholder")
    return workflow


def placeholders_in(value: Any) -> set[str]:
    """Names of the `{{name}}` placeholders among the whole string values of `value`."""
    if isinstance(value, str):
        match = _PLACEHOLDER.match(value)
        return {match.group(1)} if match else set()
    if isinstance(value, dict):
        return set().union(*map(placeholders_in, value.values()))
    if isinstance(value, list):
        return set().union(*map(placeholders_in, value))
    return set()


def fill_placeholders(value: Any, values: Mapping[str, Any]) -> Any:
    """A copy of `value` with every whole-string `{{name}}` replaced by `values[name]`."""
    if isinstance(value, str):
        match = _PLACEHOLDER.match(value)
        return values[match.group(1)] if match else value
    if isinstance(value, dict):
        return {key: fill_placeholders(item, values) for key, item in value.items()}
    if isinstance(value, list):
        return [fill_placeholders(item, values) for item in value]
    return value


def seed_for(image: bytes, plan: str) -> int:
    """The sampler seed of one (image, plan): a retried request draws the same picture."""
    return _seed(hashlib.sha256(image).digest(), plan)


def _seed(image_digest: bytes, plan: str) -> int:
    digest = hashlib.sha256(image_digest + plan.encode()).digest()
    return int.from_bytes(digest[: SEED_BITS // 8], "big")


class ComfyUIClient:
    """One ComfyUI server; `draw` never raises for ComfyUI's failures, it answers None."""

    def __init__(
        self,
        base_url: str,
        workflow: dict[str, Any],
        timeout_seconds: float,
        *,
        poll_seconds: float = POLL_SECONDS,
        failures: FailureLog | None = None,
    ) -> None:
        self._workflow = workflow
        self._timeout = timeout_seconds
        self._poll = poll_seconds
        self._failures = failures or FailureLog(
            log, "ComfyUI generation failed", FAILURE_LOG_INTERVAL_SECONDS, level=logging.WARNING
        )
        self._client_id = uuid.uuid4().hex
        self._http = httpx.AsyncClient(base_url=base_url.rstrip("/"), timeout=REQUEST_TIMEOUT_SECONDS)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> ComfyUIClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def unreachable(self) -> str | None:
        """None when `GET /system_stats` answers with JSON (ComfyUI is up); else why not."""
        try:
            _json(await self._http.get("/system_stats", timeout=PROBE_TIMEOUT_SECONDS))
        except (httpx.HTTPError, ComfyUIFailure) as error:
            return _describe(error)
        return None

    async def draw(
        self, image: bytes, masks: Mapping[str, bytes], *, timeout_seconds: float | None = None
    ) -> dict[str, bytes | None]:
        """The grown picture per plan: `image` is the client's photo as uploaded (JPEG, PNG
        or WebP; ComfyUI's LoadImage applies EXIF orientation as the analysis does),
        `masks[plan]` a PNG of the oriented photo's size, white where hair grows.
        Plans are queued together and share one deadline (`comfyui_timeout_seconds`, or the
        request's `timeout_seconds` when shorter); each comes back as the output image's
        bytes, or None. Cancelled (the client left): every queued prompt is interrupted and
        dropped from ComfyUI's queue before the cancellation goes on."""
        drawn: dict[str, bytes | None] = dict.fromkeys(masks)
        image_digest = hashlib.sha256(image).digest()  # megabytes: hashed once per request
        timeout = self._timeout if timeout_seconds is None else min(self._timeout, timeout_seconds)
        with trio.move_on_after(timeout) as deadline:
            try:
                image_name = await self._upload(image, f"hairgate-{image_digest.hex()[:16]}{_extension(image)}")
            except Exception as error:  # whatever ComfyUI does wrong, the request still answers
                self._failures.report(f"uploading the photo: {_describe(error)}")
                return drawn

            async def one(plan: str, mask: bytes) -> None:
                drawn[plan] = await self._draw_plan(image_digest, image_name, plan, mask)

            async with trio.open_nursery() as nursery:
                for plan, mask in masks.items():
                    nursery.start_soon(one, plan, mask)
        if deadline.cancelled_caught:
            self._failures.report(f"not done within {timeout:g} s")
        return drawn

    async def _draw_plan(self, image_digest: bytes, image_name: str, plan: str, mask: bytes) -> bytes | None:
        prompt_id: str | None = None
        try:
            mask_name = await self._upload(mask, f"hairgate-{image_digest.hex()[:16]}-{_digest(mask)}-mask.png")
            graph = fill_placeholders(
                self._workflow,
                {
                    "image": image_name,
                    "mask": mask_name,
                    "prompt": PROMPT,
                    "negative_prompt": NEGATIVE_PROMPT,
                    "seed": _seed(image_digest, plan),
                },
            )
            prompt_id = await self._queue(graph)
            return await self._fetch(await self._outputs(prompt_id))
        except trio.Cancelled:
            if prompt_id is not None:
                await self._abandon(prompt_id)
            raise
        except Exception as error:  # whatever ComfyUI does wrong, the request still answers
            self._failures.report(f"plan {plan}: {_describe(error)}")
            return None

    async def _upload(self, content: bytes, name: str) -> str:
        """`POST /upload/image`; the name ComfyUI stored it under, as LoadImage wants it."""
        response = await self._http.post(
            "/upload/image",
            files={"image": (name, content, "application/octet-stream")},
            data={"type": "input", "overwrite": "true"},
        )
        stored = _json(response)
        if not isinstance(stored, dict) or not isinstance(stored.get("name"), str):
            raise ComfyUIFailure(f"/upload/image answered {stored!r}")
        subfolder = stored.get("subfolder") or ""
        return f"{subfolder}/{stored['name']}" if subfolder else stored["name"]

    async def _queue(self, graph: dict[str, Any]) -> str:
        response = await self._http.post("/prompt", json={"prompt": graph, "client_id": self._client_id})
        queued = _json(response)
        if not isinstance(queued, dict) or not isinstance(queued.get("prompt_id"), str):
            raise ComfyUIFailure(f"/prompt answered {queued!r}")
        return queued["prompt_id"]

    async def _outputs(self, prompt_id: str) -> dict[str, Any]:
        """Poll `GET /history/{id}` until the prompt is done; its `outputs`."""
        while True:
            history = _json(await self._http.get(f"/history/{prompt_id}"))
            entry = history.get(prompt_id) if isinstance(history, dict) else None
            if entry:
                status = entry.get("status") or {}
                if status.get("status_str") == "error":
                    raise ComfyUIFailure(f"prompt {prompt_id} failed: {_last_message(status)}")
                if entry.get("outputs") or status.get("completed"):
                    return entry.get("outputs") or {}
            await trio.sleep(self._poll)

    async def _fetch(self, outputs: dict[str, Any]) -> bytes:
        for node_id in sorted(outputs, key=_node_order):
            for picture in outputs[node_id].get("images") or []:
                if picture.get("type", "output") == "output" and picture.get("filename"):
                    response = await self._http.get(
                        "/view",
                        params={
                            "filename": picture["filename"],
                            "subfolder": picture.get("subfolder", ""),
                            "type": "output",
                        },
                    )
                    response.raise_for_status()
                    return response.content
        raise ComfyUIFailure("the prompt finished without an output image")

    async def _abandon(self, prompt_id: str) -> None:
        """Stop a prompt we no longer wait for, so it does not hold the GPU for nobody."""
        with trio.CancelScope(shield=True), trio.move_on_after(CLEANUP_TIMEOUT_SECONDS):
            try:
                await self._http.post("/interrupt", json={"prompt_id": prompt_id})
                await self._http.post("/queue", json={"delete": [prompt_id]})
            except httpx.HTTPError as error:
                self._failures.report(f"dropping prompt {prompt_id}: {_describe(error)}")


async def draw_grown(
    client: ComfyUIClient, image: bytes, data: dict[str, Any], *, timeout_seconds: float | None = None
) -> dict[str, Any]:
    """A grow or mark answer of the model process, asked with `INPAINT_MASK_OPTION`, with
    ComfyUI's pictures in place of its inpainting masks: `grown_image_base64` and
    `generator` ("comfyui", or None where ComfyUI drew nothing or there was no mask: no
    hair to grow from). The masks never leave the host. `image`: the uploaded bytes;
    `timeout_seconds`: what is left of the request's deadline, if it has one."""
    targets = grown_targets(data)
    masks = {
        target.get("plan", "mark"): base64.b64decode(target.pop(INPAINT_MASK_KEY))
        for target in targets
        if target.get(INPAINT_MASK_KEY)
    }
    drawn = await client.draw(image, masks, timeout_seconds=timeout_seconds) if masks else {}
    for target in targets:
        target.pop(INPAINT_MASK_KEY, None)
        picture = drawn.get(target.get("plan", "mark"))
        target["grown_image_base64"] = None if picture is None else base64.b64encode(picture).decode()
        target["generator"] = None if picture is None else GENERATOR_COMFYUI
    return data


def grown_targets(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The parts of a grow or mark answer that each carry one grown image: grow's `results`,
    or the mark answer itself."""
    return data.get("results", [data])


def _json(response: httpx.Response) -> Any:
    response.raise_for_status()
    try:
        return response.json()
    except (ValueError, RecursionError):  # RecursionError: a deeply nested document
        raise ComfyUIFailure(f"{response.request.url.path} answered no JSON") from None


def _digest(content: bytes) -> str:
    return hashlib.sha256(content).hexdigest()[:16]


def _extension(image: bytes) -> str:
    if image.startswith(b"\x89PNG"):
        return ".png"
    if image.startswith(b"RIFF") and image[8:12] == b"WEBP":
        return ".webp"
    return ".jpg"


def _node_order(node_id: str) -> tuple[int, str]:
    return (int(node_id), "") if node_id.isdigit() else (1 << 62, node_id)


def _last_message(status: dict[str, Any]) -> str:
    messages = status.get("messages") or []
    return json.dumps(messages[-1], ensure_ascii=False)[:300] if messages else "no message"


def _describe(error: BaseException) -> str:
    if isinstance(error, httpx.HTTPStatusError):
        return f"HTTP {error.response.status_code} from {error.request.url.path}"
    if isinstance(error, ComfyUIFailure):
        return str(error)
    return f"{type(error).__name__} ({error})"
