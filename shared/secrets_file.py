"""Rewriting one key of a secrets TOML in place, for the admin endpoints of token rotation.

The operator's file keeps its comments and layout (tomlkit); only the named key changes.
The write is atomic and durable: a temp file in the same directory (mode 0600), fsync,
rename over the original, fsync of the directory, so a crash leaves the old file or the
new one, never a torn one, and a restarted service reads what the admin endpoint answered.

`SecretsSource` tells a service where its secret came from: a value that came from the
environment wins over the file at every start, so writing the file would change nothing
and the admin endpoint must refuse (409) instead.
"""

from __future__ import annotations

import os
import tempfile
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import tomlkit
from tomlkit.exceptions import TOMLKitError

from shared.settings import default_secrets_path

SECRETS_FILE_MODE = 0o600
MIN_TOKEN_CHARS = 16  # for a token set at run time (gateway.md § Admin endpoints)
MIN_DISTINCT_TOKEN_CHARS = 8  # "aaaaaaaaaaaaaaaa" is 16 characters and no secret
# Two admin requests at once must not interleave their read-modify-write of one file.
_WRITE_LOCK = threading.Lock()


class SecretsFileError(Exception):
    """The secrets file could not be read or written; the message names the file, never a value."""


@dataclass(frozen=True)
class SecretsSource:
    """Where a service's secret lives: the file to persist it to, or the environment (read-only)."""

    path: Path
    environment_variable: str
    from_environment: bool

    @classmethod
    def locate(
        cls,
        config_path: str | Path,
        secrets_path: str | Path | None,
        environment_variable: str,
        environ: Mapping[str, str] | None = None,
    ) -> SecretsSource:
        """As `shared.settings.load_settings` resolves it: `--secrets`, else beside the config."""
        path = Path(secrets_path) if secrets_path is not None else default_secrets_path(Path(config_path))
        environ = os.environ if environ is None else environ
        return cls(path, environment_variable, bool(environ.get(environment_variable)))


def check_token_strength(token: str) -> str | None:
    """Why the admin endpoints (the gateway's /admin/token, the host's /admin/tokens) refuse
    `token`, or None when they take it: at least 16 characters, at least 8 distinct ones,
    and sendable as a header value by any client (printable ASCII, no spaces), so that
    switching to it cannot break forwarding. The reason never quotes the token."""
    if len(token) < MIN_TOKEN_CHARS:
        return f"token 至少 {MIN_TOKEN_CHARS} 个字符"
    if not is_header_safe(token):
        return "token 只能包含可打印 ASCII 字符，不能有空格"
    if len(set(token)) < MIN_DISTINCT_TOKEN_CHARS:
        return f"token 至少要有 {MIN_DISTINCT_TOKEN_CHARS} 个不同的字符"
    return None


def is_header_safe(secret: str) -> bool:
    """Sendable as an HTTP header value by any client: printable ASCII, no spaces."""
    return all(33 <= ord(char) < 127 for char in secret)


def is_acceptable_token(token: object) -> bool:
    """A string that `check_token_strength` accepts."""
    return isinstance(token, str) and check_token_strength(token) is None


def write_secret(path: str | Path, key: str, value: str | list[str]) -> None:
    """Set the dotted `key` (e.g. "auth.shared_password") in `path`, atomically; blocking I/O.

    A missing file is created (mode 0600). Raises SecretsFileError.
    """
    path = Path(path)
    with _WRITE_LOCK:
        document = _read(path)
        _set(document, key.split("."), value)
        _replace_atomically(path, tomlkit.dumps(document).encode())


def read_secret(path: str | Path, key: str) -> object | None:
    """The value of the dotted `key` in `path`, or None when absent; raises SecretsFileError."""
    node: object = _read(Path(path))
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node.unwrap() if hasattr(node, "unwrap") else node


def _read(path: Path) -> tomlkit.TOMLDocument:
    try:
        return tomlkit.parse(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return tomlkit.document()
    except OSError as error:
        raise SecretsFileError(f"cannot read the secrets file {path}: {error.strerror}") from None
    except (TOMLKitError, UnicodeDecodeError):
        # the parser's message may quote the line, and the line may be a secret
        raise SecretsFileError(f"the secrets file {path} is not valid TOML") from None


def _set(document: tomlkit.TOMLDocument, parts: list[str], value: str | list[str]) -> None:
    table: tomlkit.items.Table | tomlkit.TOMLDocument = document
    for part in parts[:-1]:
        if part not in table:
            table[part] = tomlkit.table()
        table = table[part]
    table[parts[-1]] = value


def _replace_atomically(path: Path, data: bytes) -> None:
    directory = path.parent
    try:
        descriptor, temporary = tempfile.mkstemp(dir=directory, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as error:
        raise SecretsFileError(f"cannot write beside the secrets file {path}: {error.strerror}") from None
    try:
        with os.fdopen(descriptor, "wb") as handle:
            os.fchmod(handle.fileno(), SECRETS_FILE_MODE)
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
        _fsync_directory(directory)
    except OSError as error:
        Path(temporary).unlink(missing_ok=True)
        raise SecretsFileError(f"cannot write the secrets file {path}: {error.strerror}") from None


def _fsync_directory(directory: Path) -> None:
    """Make the rename itself durable: it lives in the directory's entries."""
    descriptor = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
