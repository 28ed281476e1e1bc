"""The gateway's admin endpoints for token rotation (gateway.md § Admin endpoints).

- `GET /admin/workers`: the pool with its addresses (the one place they are revealed),
  for `scripts/rotate_token.py` to find the GPU hosts.
- `POST /admin/token` `{"shared_password": "<new>"}`: persist the new token to the
  secrets file (atomically, comments kept), then send it from the next request on;
  requests already sent finish with the old one. A token from the environment cannot be
  persisted (it would win again at the next start): 409, nothing changed.

The router checks the internal token for both routes (`token=True`) before any handler
runs. Tokens are named only by fingerprint, in answers and in logs.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

import trio

from edge.web.http import Request, Response, json_response
from edge.web.monitor import error_answer
from shared.secrets_file import MIN_TOKEN_CHARS, SecretsFileError, SecretsSource, is_acceptable_token, write_secret
from shared.settings import token_fingerprint

if TYPE_CHECKING:
    from edge.gateway import Gateway

log = logging.getLogger("edge.admin")

ADMIN_BODY_LIMIT_BYTES = 4096
SHARED_PASSWORD_KEY = "auth.shared_password"
MSG_BAD_TOKEN_BODY = f'请求体必须是 JSON 对象 {{"shared_password": "<至少 {MIN_TOKEN_CHARS} 个可打印 ASCII 字符，无空格>"}}'
MSG_TOKEN_FROM_ENVIRONMENT = "当前 token 来自环境变量 {variable}，无法写入 secrets 文件；未做任何修改"
MSG_NO_SECRETS_FILE = "该网关启动时未指定 secrets 文件，无法保存新 token；未做任何修改"
MSG_NOT_PERSISTED = "新 token 未能写入 secrets 文件，未做任何修改：{error}"


class TokenAdmin:
    """The two handlers, bound to one gateway and where its secret lives."""

    def __init__(self, gateway: Gateway, secrets: SecretsSource | None) -> None:
        self._gateway = gateway
        self._secrets = secrets
        self._switching = trio.Lock()  # one switch at a time: file and memory stay in step

    async def workers(self, request: Request) -> Response:
        pool = self._gateway.pool
        listing = [
            {"index": worker.index, "url": worker.url, "online": worker.online, "primary": worker.primary}
            for worker in pool.active
        ]
        return json_response(200, {"workers": listing})

    async def set_token(self, request: Request) -> Response:
        new = _parse_token(request.body)
        if new is None:
            return json_response(400, error_answer(MSG_BAD_TOKEN_BODY))
        if self._secrets is None:
            return json_response(409, error_answer(MSG_NO_SECRETS_FILE))
        if self._secrets.from_environment:
            message = MSG_TOKEN_FROM_ENVIRONMENT.format(variable=self._secrets.environment_variable)
            return json_response(409, error_answer(message))
        async with self._switching:
            try:
                await trio.to_thread.run_sync(write_secret, self._secrets.path, SHARED_PASSWORD_KEY, new)
            except SecretsFileError as error:
                log.error("切换 token 失败，继续使用旧 token | %s", error)
                return json_response(500, error_answer(MSG_NOT_PERSISTED.format(error=error)))
            self._switch(new)
        return json_response(200, {"status": "ok", "fingerprint": token_fingerprint(new)})

    def _switch(self, new: str) -> None:
        gateway = self._gateway
        old = gateway.settings.auth.shared_password
        auth = gateway.settings.auth.model_copy(update={"shared_password": new})
        gateway.settings = gateway.settings.model_copy(update={"auth": auth})
        gateway.upstream.set_token(new)
        log.warning(
            "shared_password 已切换 | 旧=%s 新=%s 来源=%s",
            token_fingerprint(old),
            token_fingerprint(new),
            self._secrets.path,
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

