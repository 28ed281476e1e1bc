"""Endpoint 4 (`POST /api/v1/face/features`): a vision LLM describes the face, the gateway checks it.

The photo passes the GPU host's checks first (1001–1006, 1008, in the face workers), then
goes to an OpenAI-compatible `POST {base_url}/chat/completions` (e.g. Doubao on Volcengine
Ark) as an upright JPEG, long side ≤ 1024 px, in an `image_url` data URL, with
`response_format` a strict JSON schema generated from `FaceFeatures`. The answer is
validated with that model; an invalid one is asked for once more. Not configured: 1007
`MSG_FEATURES_NOT_CONFIGURED`; timeout, transport or HTTP error, or two invalid answers:
1007 `MSG_FEATURES_UNAVAILABLE`; both with Retry-After.

`timeout_seconds` bounds the whole exchange with the LLM, the retry included. The API key
goes only into the `Authorization` header: never into a log line, an error or an answer.
"""

from __future__ import annotations

import base64
import json
import logging
from typing import Any

import httpx
import trio
from pydantic import BaseModel, ValidationError

from edge.local import face_jobs
from edge.local.face_workers import FaceWorkers
from edge.local.local_answer import LocalAnswer, answered, refused
from shared.contract import MSG_FEATURES_NOT_CONFIGURED, MSG_FEATURES_UNAVAILABLE, Code, ContractError
from shared.contract.answers import SUMMARY_MAX_CHARS, FaceFeatures
from shared.settings import AnalysisSettings, FeaturesSettings

log = logging.getLogger("edge.features")

SCHEMA_NAME = "face_features"
ATTEMPTS = 2  # an answer that fails validation is asked for once more
# An upstream outage or rate limit lasts longer than a busy CPU.
RETRY_AFTER_SECONDS = 10
NOT_CONFIGURED_RETRY_AFTER_SECONDS = 3600
_PROMPT = (
    "你是一名面部形象分析师。请观察照片中的人脸，按给定的 JSON 结构回答：脸型、肤色与皮肤状况、"
    f"发量、发色，以及不超过 {SUMMARY_MAX_CHARS} 字的中文总结。只描述照片中可见的特征，不做医学诊断。"
)


class InvalidAnswer(Exception):
    """The LLM answered, but not a valid `FaceFeatures`."""


def strict_schema(model: type[BaseModel]) -> dict[str, Any]:
    """`model`'s JSON schema with every `$ref` inlined: strict mode needs `required` and
    `additionalProperties: false` on every object (extra="forbid" gives both), and not
    every OpenAI-compatible server resolves `$defs`."""
    schema = model.model_json_schema()
    definitions = schema.pop("$defs", {})

    def inline(node: Any) -> Any:
        if isinstance(node, dict):
            if "$ref" in node:
                return inline(definitions[node["$ref"].rsplit("/", 1)[-1]])
            return {key: inline(value) for key, value in node.items()}
        if isinstance(node, list):
            return [inline(item) for item in node]
        return node

    return inline(schema)


RESPONSE_FORMAT = {
    "type": "json_schema",
    "json_schema": {"name": SCHEMA_NAME, "strict": True, "schema": strict_schema(FaceFeatures)},
}


def chat_request(model: str, jpeg: bytes) -> dict[str, Any]:
    """The chat-completions body: the instructions, the photo as a data URL, the schema."""
    photo_url = "data:image/jpeg;base64," + base64.b64encode(jpeg).decode("ascii")
    return {
        "model": model,
        "messages": [
            {"role": "system", "content": _PROMPT},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "请分析这张照片中的人脸。"},
                    {"type": "image_url", "image_url": {"url": photo_url}},
                ],
            },
        ],
        "response_format": RESPONSE_FORMAT,
        "temperature": 0,
    }


def parse_answer(document: Any) -> FaceFeatures:
    """The features in a chat-completions response; InvalidAnswer says what is wrong."""
    try:
        message = document["choices"][0]["message"]
        content = message["content"]
    except (KeyError, IndexError, TypeError):
        raise InvalidAnswer("no choices[0].message.content") from None
    if message.get("refusal"):
        raise InvalidAnswer("the model refused")
    if not isinstance(content, str):
        raise InvalidAnswer("content is not a string")
    try:
        return FaceFeatures.model_validate_json(content)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "(answer)"
        raise InvalidAnswer(f"{where}: {first['msg']}") from None


class Features:
    """Answers endpoint 4; `workers.run()` and `self.run()` must be running."""

    def __init__(
        self,
        settings: FeaturesSettings,
        workers: FaceWorkers,
        limits: AnalysisSettings,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.settings = settings
        self.limits = limits
        self._workers = workers
        self._transport = transport
        self._client: httpx.AsyncClient | None = None

    def reconfigure(self, settings: FeaturesSettings, limits: AnalysisSettings) -> None:
        """Reloaded settings, for the requests that start from now on."""
        self.settings, self.limits = settings, limits

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Own the HTTP client (its connections to the LLM) until cancelled."""
        async with httpx.AsyncClient(transport=self._transport, follow_redirects=False) as client:
            self._client = client
            task_status.started()
            try:
                await trio.sleep_forever()
            finally:
                self._client = None

    async def answer(self, body: bytes, content_type: str | None, request_id: str) -> LocalAnswer:
        settings = self.settings
        if not settings.base_url:
            error = ContractError(Code.SYSTEM_ERROR, MSG_FEATURES_NOT_CONFIGURED)
            return refused(error, request_id, NOT_CONFIGURED_RETRY_AFTER_SECONDS)
        try:
            jpeg = await self._workers.call(request_id, face_jobs.features_photo, body, content_type, self.limits)
            features = await self._ask(settings, jpeg, request_id)
        except ContractError as error:
            return refused(error, request_id, RETRY_AFTER_SECONDS)
        return answered(request_id, {**features.model_dump(), "model": settings.model})

    async def _ask(self, settings: FeaturesSettings, jpeg: bytes, request_id: str) -> FaceFeatures:
        """The validated features, or 1007 MSG_FEATURES_UNAVAILABLE (logged, key never named)."""
        if self._client is None:
            raise RuntimeError("Features.run() is not running")
        request = self._client.build_request(
            "POST",
            f"{settings.base_url}/chat/completions",
            json=chat_request(settings.model, jpeg),
            headers={"Authorization": f"Bearer {settings.api_key}"},
            timeout=settings.timeout_seconds,
        )
        reason = "timeout"  # httpx's own timeout (the same seconds, per phase)
        with trio.move_on_after(settings.timeout_seconds) as deadline:
            for attempt in range(1, ATTEMPTS + 1):
                try:
                    return await self._exchange(self._client, request)
                except InvalidAnswer as error:
                    reason = f"invalid answer ({error})"
                    log.warning("面部特征回答无效 | request_id=%s | 第%d次 | 原因=%s", request_id, attempt, error)
                except httpx.TimeoutException:
                    break
                except httpx.HTTPStatusError as error:
                    reason = f"HTTP {error.response.status_code}"
                    break
                except httpx.HTTPError as error:  # connection refused, reset, protocol errors
                    reason = type(error).__name__
                    break
        if deadline.cancelled_caught:
            reason = f"no valid answer within {settings.timeout_seconds:g}s"
        log.error("面部特征分析失败 | request_id=%s | 原因=%s", request_id, reason)
        raise ContractError(Code.SYSTEM_ERROR, MSG_FEATURES_UNAVAILABLE)

    @staticmethod
    async def _exchange(client: httpx.AsyncClient, request: httpx.Request) -> FaceFeatures:
        response = await client.send(request)
        response.raise_for_status()
        try:
            document = json.loads(response.content)
        except ValueError:
            raise InvalidAnswer("the response is not JSON") from None
        return parse_answer(document)
