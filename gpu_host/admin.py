"""The host's accepted tokens, managed at run time: `GET/POST /admin/tokens` (gpu_host.md).

`HostTokens` is the one writer of the `TokenGuard`'s list once the host serves: the admin
endpoint (add, remove) and SIGHUP (`reload`) both go through it, so the list it reports
is the list the guard checks. It also remembers when each token last authenticated a
request, which is how `scripts/rotate_token.py` knows that no gateway sends the old token
any more before removing it.

Changes are written to the host's secrets file first (atomically, comments kept) and
applied second; a failed write changes nothing. Tokens that came from the environment
win over the file at every start, so they cannot be persisted: 409.
"""

from __future__ import annotations

import hmac
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio
from quart import Blueprint, jsonify, request

from gpu_host.auth import TokenGuard
from shared.contract import HEADER_REQUEST_ID, HEADER_TOKEN, Code, envelope, request_id_from_header
from shared.secrets_file import MIN_TOKEN_CHARS, SecretsFileError, SecretsSource, check_token_strength, write_secret
from shared.settings import token_fingerprint

ACCEPT_PASSWORDS_KEY = "auth.accept_passwords"
MSG_BAD_BODY = (
    f'body must be {{"add": "<token of at least {MIN_TOKEN_CHARS} printable ASCII characters>"}}'
    ' or {"remove": "<fingerprint>"}'
)
MSG_FROM_ENVIRONMENT = (
    "the accepted tokens come from the environment ({variable}) and cannot be persisted; nothing changed"
)
MSG_LAST_TOKEN = "refusing to remove the last accepted token"
MSG_OWN_TOKEN = "refusing to remove the token this request authenticated with"
MSG_AMBIGUOUS = "several accepted tokens have this fingerprint; nothing changed"
MSG_NOT_PERSISTED = "the secrets file could not be written; nothing changed: {error}"


class AdminRefusal(Exception):
    """A change refused as a whole: HTTP `status` with a message that names no token."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class HostTokens:
    """The accepted tokens in order, when each was last used, and where they are persisted."""

    def __init__(
        self,
        guard: TokenGuard,
        tokens: tuple[str, ...],
        secrets: SecretsSource,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._guard = guard
        self._tokens = tokens
        self._secrets = secrets
        self._clock = clock
        self._last_used: dict[str, float] = {}
        self._changing = trio.Lock()  # one change at a time: file and guard stay in step

    @property
    def secrets_path(self) -> Path:
        """The file the tokens are persisted to (its filesystem is one the host writes to)."""
        return self._secrets.path

    def authenticated(self, token: str) -> None:
        """Called for every request the guard accepted, with the token it presented."""
        self._last_used[token] = self._clock()

    def reload(self, tokens: tuple[str, ...]) -> None:
        """SIGHUP: the list from the re-read settings; ValueError (from the guard) when empty."""
        self._guard.replace(tokens)
        self._tokens = tokens
        self._last_used = {token: at for token, at in self._last_used.items() if token in tokens}

    def listing(self) -> list[dict[str, Any]]:
        now = self._clock()
        return [
            {
                "fingerprint": token_fingerprint(token),
                "last_used_seconds_ago": None
                if token not in self._last_used
                else round(now - self._last_used[token], 3),
            }
            for token in self._tokens
        ]

    async def add(self, token: str) -> None:
        async with self._changing:
            if token not in self._tokens:
                await self._persist_and_apply((*self._tokens, token))

    async def remove(self, fingerprint: str, caller_token: str) -> None:
        """Idempotent: a fingerprint no longer accepted is already removed."""
        async with self._changing:
            matching = [token for token in self._tokens if token_fingerprint(token) == fingerprint]
            if not matching:
                return
            if len(matching) > 1:
                raise AdminRefusal(409, MSG_AMBIGUOUS)
            if hmac.compare_digest(matching[0].encode(), caller_token.encode()):
                raise AdminRefusal(409, MSG_OWN_TOKEN)
            if len(self._tokens) == 1:
                raise AdminRefusal(409, MSG_LAST_TOKEN)
            await self._persist_and_apply(tuple(token for token in self._tokens if token != matching[0]))

    async def _persist_and_apply(self, tokens: tuple[str, ...]) -> None:
        if self._secrets.from_environment:
            raise AdminRefusal(409, MSG_FROM_ENVIRONMENT.format(variable=self._secrets.environment_variable))
        try:
            await trio.to_thread.run_sync(write_secret, self._secrets.path, ACCEPT_PASSWORDS_KEY, list(tokens))
        except SecretsFileError as error:
            raise AdminRefusal(500, MSG_NOT_PERSISTED.format(error=error)) from None
        self.reload(tokens)


def admin_blueprint(tokens: HostTokens) -> Blueprint:
    """`GET/POST /admin/tokens`; the app's token check runs first (its before_request)."""
    admin = Blueprint("admin", __name__, url_prefix="/admin")

    @admin.route("/tokens", methods=["GET", "POST"])
    async def admin_tokens() -> Any:
        if request.method == "POST":
            try:
                await _change(tokens, _parsed(await request.get_data(cache=True, as_text=False, parse_form_data=False)))
            except AdminRefusal as refusal:
                if refusal.status == 400:
                    return jsonify(envelope(Code.INVALID_PARAMETER, _request_id(), message=str(refusal))), 400
                return jsonify(status="refused", message=str(refusal)), refusal.status
        return jsonify(tokens=tokens.listing())

    return admin


def _parsed(raw: bytes) -> Any:
    """The JSON body; a 400 when it is none (RecursionError: nesting deeper than the parser goes)."""
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        raise AdminRefusal(400, MSG_BAD_BODY) from None


async def _change(tokens: HostTokens, body: Any) -> None:
    if isinstance(body, dict) and set(body) == {"add"} and isinstance(body["add"], str):
        weakness = check_token_strength(body["add"])
        if weakness is not None:
            raise AdminRefusal(400, weakness)
        await tokens.add(body["add"])
    elif isinstance(body, dict) and set(body) == {"remove"} and isinstance(body["remove"], str):
        await tokens.remove(body["remove"], request.headers.get(HEADER_TOKEN, ""))
    else:
        raise AdminRefusal(400, MSG_BAD_BODY)


def _request_id() -> str:
    return request_id_from_header(request.headers.get(HEADER_REQUEST_ID))
