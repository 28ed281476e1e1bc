"""A fake OpenAI-compatible vision LLM: `POST /api/v3/chat/completions`, no model.

The path is Volcengine Ark's (`base_url` = `<url>/api/v3`, the client appends
`/chat/completions`), the shapes are OpenAI's chat-completions API: a request with
`model`, `messages` (text and `image_url` parts) and `response_format`; an answer
`{id, object: "chat.completion", created, model, choices: [{index, message: {role,
content}, finish_reason}], usage}`; errors `{"error": {message, type, param, code}}`
(401 for a missing or wrong Bearer key, 400 for a body without model or messages).

Knobs (`FakeLLM.knobs`): `script` is the behaviour of the next requests, one `Mode` each,
then `mode` for the rest. Every request is recorded (headers, JSON body) so a test can
check what the gateway sent. Served in-process on loopback by `serve_fake_llm`.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import time
import uuid
from typing import Any

import trio
from quart import jsonify, request
from quart_trio import QuartTrio

from tests.fakes.serve import serve_on_loopback

API_PREFIX = "/api/v3"
VALID_FEATURES = {
    "face_shape": "oval",
    "skin": {"tone": "light", "condition": "皮肤光滑，无明显瑕疵"},
    "hair_density": "normal",
    "hair_color": "棕色",
    "summary": "椭圆脸型，肤色偏白，皮肤状态良好；发量正常，发色为棕色。",
}


class Mode(enum.Enum):
    VALID = "valid"  # content: VALID_FEATURES as JSON
    INVALID_JSON = "invalid_json"  # content: not JSON at all
    SCHEMA_VIOLATION = "schema_violation"  # JSON, but face_shape outside the enum
    HTTP_500 = "http_500"  # an OpenAI-style server error
    NEVER_ANSWER = "never_answer"  # holds the request until the client gives up


@dataclasses.dataclass
class Knobs:
    mode: Mode = Mode.VALID
    script: list[Mode] = dataclasses.field(default_factory=list)
    api_key: str = ""


@dataclasses.dataclass
class Recorded:
    headers: dict[str, str]  # lower-case names
    body: Any


@dataclasses.dataclass
class FakeLLM:
    knobs: Knobs = dataclasses.field(default_factory=Knobs)
    requests: list[Recorded] = dataclasses.field(default_factory=list)
    url: str = ""

    @property
    def base_url(self) -> str:
        return self.url + API_PREFIX


def _error(status: int, message: str, kind: str) -> Any:
    return jsonify(error={"message": message, "type": kind, "param": None, "code": None}), status


def _completion(model: str, content: str) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": "stop",
                "logprobs": None,
            }
        ],
        "usage": {"prompt_tokens": 1200, "completion_tokens": 80, "total_tokens": 1280},
    }


def _content(mode: Mode) -> str:
    if mode is Mode.INVALID_JSON:
        return '{"face_shape": "oval", "skin": {"tone": '
    if mode is Mode.SCHEMA_VIOLATION:
        return json.dumps({**VALID_FEATURES, "face_shape": "pear"}, ensure_ascii=False)
    return json.dumps(VALID_FEATURES, ensure_ascii=False)


def create_app(fake: FakeLLM) -> QuartTrio:
    app = QuartTrio(__name__)

    @app.post(f"{API_PREFIX}/chat/completions")
    async def chat_completions() -> Any:
        body = await request.get_json(silent=True)
        fake.requests.append(Recorded({name.lower(): value for name, value in request.headers.items()}, body))
        if request.headers.get("Authorization") != f"Bearer {fake.knobs.api_key}":
            return _error(401, "Incorrect API key provided.", "invalid_request_error")
        if not isinstance(body, dict) or "model" not in body or "messages" not in body:
            return _error(400, "model and messages are required", "invalid_request_error")
        mode = fake.knobs.script.pop(0) if fake.knobs.script else fake.knobs.mode
        if mode is Mode.HTTP_500:
            return _error(500, "The server had an error while processing your request.", "server_error")
        if mode is Mode.NEVER_ANSWER:
            await trio.sleep_forever()
        return jsonify(_completion(body["model"], _content(mode)))

    return app


async def serve_fake_llm(fake: FakeLLM, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
    """Serve `fake` on a free loopback port until cancelled; `nursery.start` gives its base URL."""
    async with trio.open_nursery() as nursery:
        fake.url = await nursery.start(serve_on_loopback, create_app(fake))
        task_status.started(fake.base_url)
