"""The gateway's admin endpoints for token rotation (gateway.md § Admin endpoints).

- `GET /admin/workers`: the pool with its addresses (the one place they are revealed),
  for `scripts/rotate_token.py` to find the GPU hosts.
- `POST /admin/token` `{"shared_password": "<new>"}`: persist the new token to the
  secrets file (atomically, comments kept), then send it from the next request on;
  requests already sent finish with the old one. A token from the environment cannot be
  persisted (it would win again at the next start): 409, nothing changed.

| path            | methods   | body  |
|-----------------|-----------|-------|
| /admin/stats    | GET, HEAD | none  |
| /admin/workers  | GET, HEAD | none  |
| /admin/audit    | GET, HEAD | none  |
| /admin/token    | POST      | 4 KiB |

Every route needs the internal token, checked before any body byte is read
(`requires_token`). A switch and a settings reload (SIGHUP) take the same lock
(`Gateway.settings_lock`): neither can undo the other. Tokens are named only by
fingerprint, in answers and in logs.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

import trio
from quart import Blueprint, request
from quart import Response as QuartResponse

from edge.audit.admin import audit_answer
from edge.web.http import current_gateway_request, json_page
from edge.web.monitor import error_answer
from edge.web.refusals import requires_token
from shared.secrets_file import (
    MIN_DISTINCT_TOKEN_CHARS,
    MIN_TOKEN_CHARS,
    SecretsFileError,
    SecretsSource,
    is_acceptable_token,
    write_secret,
)
from shared.settings import token_fingerprint

if TYPE_CHECKING:
    from edge.gateway import Gateway

log = logging.getLogger("edge.admin")

ADMIN_BODY_LIMIT_BYTES = 4096
SHARED_PASSWORD_KEY = "auth.shared_password"
MSG_BAD_TOKEN_BODY = (
    f'请求体必须是 JSON 对象 {{"shared_password": "<至少 {MIN_TOKEN_CHARS} 个可打印 ASCII 字符，'
    f'其中至少 {MIN_DISTINCT_TOKEN_CHARS} 个不同，无空格>"}}'
)
MSG_TOKEN_FROM_ENVIRONMENT = "当前 token 来自环境变量 {variable}，无法写入 secrets 文件；未做任何修改"
MSG_NO_SECRETS_FILE = "该网关启动时未指定 secrets 文件，无法保存新 token；未做任何修改"
MSG_NOT_PERSISTED = "新 token 未能写入 secrets 文件，未做任何修改：{error}"


def admin_blueprint(gateway: Gateway) -> Blueprint:
    admin = Blueprint("admin", __name__, url_prefix="/admin")
    tokens = TokenAdmin(gateway)
    token = requires_token(gateway)

    @admin.get("/stats")
    @token
    async def stats() -> QuartResponse:
        return json_page(200, gateway.stats.snapshot())

    @admin.get("/workers")
    @token
    async def workers() -> QuartResponse:
        return json_page(200, tokens.workers())

    @admin.get("/audit")
    @token
    async def audit() -> QuartResponse:  # edge.audit.admin
        return json_page(
            *await audit_answer(gateway.audit, request.args, request.headers.get, gateway.admission.client_keys)
        )

    @admin.post("/token")
    @token
    async def set_token() -> QuartResponse:
        request.max_content_length = ADMIN_BODY_LIMIT_BYTES
        return json_page(*await tokens.set_token(await current_gateway_request().read_body()))

    return admin


class TokenAdmin:
    """The pool listing and the token switch of one gateway (and where its secret lives)."""

    def __init__(self, gateway: Gateway) -> None:
        self._gateway = gateway

    def workers(self) -> dict[str, Any]:
        listing = [
            {
                "index": worker.index, "url": worker.url, "online": worker.online, "primary": worker.primary,
                # the host's deep checks, its own model-call timeout and its model version, as its
                # /health last said (the version: which host an upgrade left behind)
                "checks": dict(worker.checks), "inference_timeout_seconds": worker.inference_timeout_seconds,
                "model_version": worker.model_version,
            }
            for worker in self._gateway.pool.active
        ]  # fmt: skip
        return {"workers": listing}

    async def set_token(self, body: bytes) -> tuple[int, dict[str, Any]]:
        new = _parse_token(body)
        if new is None:
            return 400, error_answer(MSG_BAD_TOKEN_BODY)
        secrets = self._gateway.secrets
        if secrets is None:
            return 409, error_answer(MSG_NO_SECRETS_FILE)
        if secrets.from_environment:
            return 409, error_answer(MSG_TOKEN_FROM_ENVIRONMENT.format(variable=secrets.environment_variable))
        async with self._gateway.settings_lock:  # file and memory in step, and no reload in between
            try:
                await trio.to_thread.run_sync(write_secret, secrets.path, SHARED_PASSWORD_KEY, new)
            except SecretsFileError as error:
                log.error("切换 token 失败，继续使用旧 token | %s", error)
                return 500, error_answer(MSG_NOT_PERSISTED.format(error=error))
            self._switch(new, secrets)
        return 200, {"status": "ok", "fingerprint": token_fingerprint(new)}

    def _switch(self, new: str, secrets: SecretsSource) -> None:
        old = self._gateway.switch_token(new)
        log.warning(
            "shared_password 已切换 | 旧=%s 新=%s 来源=%s",
            token_fingerprint(old),
            token_fingerprint(new),
            secrets.path,
        )


def _parse_token(body: bytes) -> str | None:
    try:
        document: Any = json.loads(body)
    except (ValueError, RecursionError):
        return None
    if not isinstance(document, dict) or set(document) != {"shared_password"}:
        return None
    token = document["shared_password"]
    return token if is_acceptable_token(token) else None
