"""The files a cluster runs with: a settings TOML and a private secrets TOML.

The token is written to the secrets file only, created 0600 so that no other user can read
it, not even for a moment; a child learns it from that file (`--secrets`), never from its
environment or its command line.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping, MutableMapping
from pathlib import Path
from typing import Any

import tomlkit


def new_token() -> str:
    return secrets.token_urlsafe(32)


def write_secrets(path: Path, token: str) -> Path:
    """`[auth]` with `token` as the password sent and the one accepted; mode 0600 from creation."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(tomlkit.dumps({"auth": {"shared_password": token, "accept_passwords": [token]}}))
    return path


def write_settings(path: Path, document: Mapping[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(tomlkit.dumps(document))
    return path


def edit_settings(path: Path, changes: Mapping[str, Any]) -> Path:
    """Apply `changes` (nested tables merge key by key) to the TOML at `path`, keeping its comments."""
    document = tomlkit.parse(path.read_text())
    merge(document, changes)
    return write_settings(path, document)


def merge(base: MutableMapping[str, Any], changes: Mapping[str, Any]) -> MutableMapping[str, Any]:
    """`base` with `changes` merged in, table by table; any other value replaces what was there."""
    for key, value in changes.items():
        if isinstance(value, Mapping) and isinstance(base.get(key), MutableMapping):
            merge(base[key], value)
        else:
            base[key] = value
    return base
