"""A fake ComfyUI: the routes of ComfyUI's `server.py` that the GPU host uses, no model.

`POST /upload/image` stores the multipart `image` under its filename (answering `{name,
subfolder, type}` as ComfyUI does), `POST /prompt` checks that every LoadImage /
LoadImageMask names an uploaded file and queues the graph, `GET /history/{id}` answers
`{}` until the prompt is done and then `{id: {prompt, outputs, status}}`, `GET /view`
serves the output PNG. `POST /interrupt` (`{"prompt_id": id}`: stops that prompt if it
runs, as ComfyUI does since it knows the field) and `POST /queue` (`{"delete": [ids]}`:
drops them) record what they were asked and end those prompts: `/history` then shows them
failed with ComfyUI's `execution_interrupted` message. `GET /system_stats` answers
ComfyUI's shape (`system`, `devices`). The drawn output is the uploaded photo with the
mask's white area painted `PAINT`, so a test can tell the output from the input and check
the mask's size.

Knobs (`FakeComfyUI.knobs`): `fail_status` makes every route answer that HTTP status;
`never_finish` keeps prompts running forever. Events (`prompt_queued`, `interrupted`) wake
a test when a prompt arrives or an interrupt does. "Down" is a port nobody listens on:
`SwitchableComfyUI` stops serving (connections refused) and starts again on the same port.
Served in-process on loopback by `serve_fake_comfyui` (real sockets, real HTTP).
"""

from __future__ import annotations

import dataclasses
import io
import uuid
from functools import partial
from typing import Any

import numpy as np
import trio
from PIL import Image, ImageOps
from quart import Response, jsonify, request
from quart_trio import QuartTrio

from tests.fakes.serve import serve_on_loopback

PAINT = (255, 0, 255)
IMAGE_LOADERS = ("LoadImage", "LoadImageMask")


@dataclasses.dataclass
class Knobs:
    fail_status: int | None = None
    never_finish: bool = False


@dataclasses.dataclass
class FakeComfyUI:
    """What the fake saw, and its knobs; `url` is set once it listens."""

    knobs: Knobs = dataclasses.field(default_factory=Knobs)
    uploads: dict[str, bytes] = dataclasses.field(default_factory=dict)  # name -> bytes
    upload_forms: list[dict[str, str]] = dataclasses.field(default_factory=list)
    prompts: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)  # prompt_id -> graph
    client_ids: list[str] = dataclasses.field(default_factory=list)
    outputs: dict[str, bytes] = dataclasses.field(default_factory=dict)  # output filename -> PNG
    interrupts: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    interrupt_times: list[float] = dataclasses.field(default_factory=list)  # trio clock
    queue_requests: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    ended: set[str] = dataclasses.field(default_factory=set)  # prompts interrupted or deleted
    history_polls: int = 0
    system_stats_polls: int = 0
    prompt_queued: trio.Event = dataclasses.field(default_factory=trio.Event)
    interrupted: trio.Event = dataclasses.field(default_factory=trio.Event)
    url: str = ""


def create_app(fake: FakeComfyUI) -> QuartTrio:
    app = QuartTrio(__name__)

    @app.before_request
    async def failing() -> Any:
        if fake.knobs.fail_status is not None:
            return Response("fake failure", status=fake.knobs.fail_status)
        return None

    @app.post("/upload/image")
    async def upload_image() -> Any:
        files, form = await request.files, await request.form
        image = files.get("image")
        if image is None or not image.filename:
            return "", 400
        fake.uploads[image.filename] = image.read()
        fake.upload_forms.append(dict(form))
        return jsonify(name=image.filename, subfolder=form.get("subfolder", ""), type=form.get("type", "input"))

    @app.post("/prompt")
    async def queue_prompt() -> Any:
        body = await request.get_json()
        graph = body.get("prompt") if isinstance(body, dict) else None
        if not isinstance(graph, dict):
            return jsonify(error={"type": "no_prompt", "message": "No prompt provided"}, node_errors={}), 400
        for node in graph.values():
            if node["class_type"] in IMAGE_LOADERS and node["inputs"]["image"] not in fake.uploads:
                return jsonify(
                    error={
                        "type": "prompt_outputs_failed_validation",
                        "message": f"Invalid image file: {node['inputs']['image']}",
                    },
                    node_errors={},
                ), 400
        prompt_id = str(uuid.uuid4())
        fake.prompts[prompt_id] = graph
        fake.client_ids.append(body.get("client_id", ""))
        fake.prompt_queued.set()
        return jsonify(prompt_id=prompt_id, number=len(fake.prompts) - 1, node_errors={})

    @app.get("/history/<prompt_id>")
    async def history(prompt_id: str) -> Any:
        fake.history_polls += 1
        graph = fake.prompts.get(prompt_id)
        if graph is not None and prompt_id in fake.ended:
            return jsonify(
                {
                    prompt_id: {
                        "prompt": [0, prompt_id, graph, {"client_id": ""}, []],
                        "outputs": {},
                        "status": {
                            "status_str": "error",
                            "completed": False,
                            "messages": [
                                ["execution_start", {"prompt_id": prompt_id}],
                                [
                                    "execution_interrupted",
                                    {"prompt_id": prompt_id, "node_id": "3", "node_type": "KSampler"},
                                ],
                            ],
                        },
                        "meta": {},
                    }
                }
            )
        if graph is None or fake.knobs.never_finish:
            return jsonify({})
        filename = f"hairgate_{len(fake.outputs):05d}_.png"
        fake.outputs.setdefault(filename, _draw(fake, graph))
        save_node = next(key for key, node in graph.items() if node["class_type"] == "SaveImage")
        return jsonify(
            {
                prompt_id: {
                    "prompt": [0, prompt_id, graph, {"client_id": ""}, [save_node]],
                    "outputs": {save_node: {"images": [{"filename": filename, "subfolder": "", "type": "output"}]}},
                    "status": {"status_str": "success", "completed": True, "messages": []},
                    "meta": {},
                }
            }
        )

    @app.get("/view")
    async def view() -> Any:
        content = fake.outputs.get(request.args.get("filename", ""))
        if content is None or request.args.get("type") != "output":
            return "", 404
        return Response(content, content_type="image/png")

    @app.post("/interrupt")
    async def interrupt() -> Any:
        body = await request.get_json(silent=True) or {}
        fake.interrupts.append(body)
        fake.interrupt_times.append(trio.current_time())
        if body.get("prompt_id") in fake.prompts:
            fake.ended.add(body["prompt_id"])
        fake.interrupted.set()
        return "", 200

    @app.post("/queue")
    async def queue() -> Any:
        body = await request.get_json(silent=True) or {}
        fake.queue_requests.append(body)
        fake.ended.update(prompt_id for prompt_id in body.get("delete", []) if prompt_id in fake.prompts)
        return "", 200

    @app.get("/system_stats")
    async def system_stats() -> Any:
        fake.system_stats_polls += 1
        return jsonify(
            system={"os": "posix", "ram_total": 64 << 30, "ram_free": 60 << 30, "comfyui_version": "0.3.40",
                    "python_version": "3.11.7", "pytorch_version": "2.5.1", "embedded_python": False,
                    "argv": ["main.py", "--listen", "127.0.0.1"]},
            devices=[{"name": "cuda:0 fake", "type": "cuda", "index": 0, "vram_total": 24 << 30,
                      "vram_free": 20 << 30, "torch_vram_total": 0, "torch_vram_free": 0}],
        )  # fmt: skip

    return app


def _draw(fake: FakeComfyUI, graph: dict[str, Any]) -> bytes:
    """The photo with the mask's white area painted: what "inpainting" means here."""
    image_name = next(node["inputs"]["image"] for node in graph.values() if node["class_type"] == "LoadImage")
    mask_name = next(node["inputs"]["image"] for node in graph.values() if node["class_type"] == "LoadImageMask")
    photo = np.array(ImageOps.exif_transpose(Image.open(io.BytesIO(fake.uploads[image_name]))).convert("RGB"))
    mask = np.array(Image.open(io.BytesIO(fake.uploads[mask_name])).convert("L")) >= 128
    if mask.shape != photo.shape[:2]:
        raise ValueError(f"mask {mask.shape} does not match the photo {photo.shape[:2]}")
    photo[mask] = PAINT
    buffer = io.BytesIO()
    Image.fromarray(photo).save(buffer, format="PNG")
    return buffer.getvalue()


async def serve_fake_comfyui(
    fake: FakeComfyUI, *, port: int = 0, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED
) -> None:
    """Serve `fake` on loopback `port` (0: a free one) until cancelled; `nursery.start` gives its URL."""
    async with trio.open_nursery() as nursery:
        fake.url = await nursery.start(partial(serve_on_loopback, create_app(fake), port=port))
        task_status.started(fake.url)


class SwitchableComfyUI:
    """`fake` served in `nursery` while up; down, its port refuses connections, as a stopped
    ComfyUI's does. Comes up on the same port (the URL a host was configured with)."""

    def __init__(self, fake: FakeComfyUI, nursery: trio.Nursery) -> None:
        self.fake = fake
        self._nursery = nursery
        self._port = 0
        self._scope: trio.CancelScope | None = None
        self._stopped = trio.Event()

    async def up(self) -> str:
        async def serve_until_down(task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
            with trio.CancelScope() as self._scope:
                await serve_fake_comfyui(self.fake, port=self._port, task_status=task_status)
            self._stopped.set()

        self._stopped = trio.Event()
        url = await self._nursery.start(serve_until_down)
        self._port = int(url.rsplit(":", 1)[1])
        return url

    async def down(self) -> None:
        """Stop serving; returns once the port is closed."""
        assert self._scope is not None
        self._scope.cancel()
        await self._stopped.wait()
