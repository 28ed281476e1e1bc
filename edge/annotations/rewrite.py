"""The image rewrite: every `*_base64` PNG in a worker's answer becomes a file and a URL.

Workers never write files or build URLs (contract.md § Images in responses). For each key
ending in `_base64`, at any depth in objects and arrays, the gateway decodes the value,
checks that it is a PNG, writes `<static_dir>/annotations/<uuid4>.png` atomically (temp
file + rename) and replaces the key by its `_url` twin. `null` stays `null` and writes
nothing. Two steps, so that a worker that sent a bad image is judged while its lease is
still held and the (slower) file writes happen after the worker is free again:
`decode()` checks every image (`BadImage`: a worker failure), `write()` stores them
all or none (`ImageWriteError`: the gateway's own file system, never the worker's fault).
"""

from __future__ import annotations

import base64
import binascii
import os
import uuid
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from shared.contract import BASE64_SUFFIX, url_key_for

ANNOTATIONS = "annotations"
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_PNG_END = b"\x00\x00\x00\x00IEND\xaeB`\x82"  # the empty IEND chunk and its CRC
_BASE64_KEY_MARK = (BASE64_SUFFIX + '"').encode()


class BadImage(Exception):
    """The worker sent an image that is not valid base64 of a PNG: a worker failure."""


class ImageWriteError(Exception):
    """Writing the annotation files failed on the gateway's own file system (full disk, …)."""


@dataclass(frozen=True)
class DecodedImages:
    """The PNG bytes of an answer's image fields in document order; None where the field is null."""

    pngs: list[bytes | None]


def has_images(raw: bytes) -> bool:
    """Cheap pre-check on the raw JSON: most answers have no `_base64` key at all."""
    return _BASE64_KEY_MARK in raw


def check_png(data: bytes) -> None:
    """Signature, a well-formed IHDR chunk with a matching CRC, and the final IEND chunk.

    Cheap checks that catch what a broken worker sends (other formats, truncation)
    without decoding the image.
    """
    if not data.startswith(_PNG_SIGNATURE) or len(data) < 33 or data[12:16] != b"IHDR":
        raise BadImage("not a PNG")
    if int.from_bytes(data[29:33], "big") != zlib.crc32(data[12:29]):
        raise BadImage("PNG header CRC mismatch")
    if not data.endswith(_PNG_END):
        raise BadImage("PNG is truncated (no IEND chunk)")


def decode_png(value: str) -> bytes:
    try:
        data = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise BadImage("invalid base64") from None
    check_png(data)
    return data


class ImageStore:
    """Writes annotation PNGs under `static_dir` and names their public URLs."""

    def __init__(self, static_dir: str | Path, public_base_url: str, limiter: trio.CapacityLimiter) -> None:
        self.directory = Path(static_dir) / ANNOTATIONS
        self._url_prefix = f"{public_base_url.rstrip('/')}/static/{ANNOTATIONS}/"
        self._limiter = limiter

    async def decode(self, body: Any) -> DecodedImages:
        """Every image of `body`, checked; raises BadImage (in a thread: base64 of megabytes)."""
        values: list[Any] = []
        _collect(body, values)
        if not values:
            return DecodedImages([])
        return await trio.to_thread.run_sync(_decode_all, values, limiter=self._limiter)

    async def write(self, body: Any, images: DecodedImages) -> Any:
        """A copy of `body` with every `*_base64` replaced by its URL; raises ImageWriteError."""
        if not images.pngs:
            return body
        names = await trio.to_thread.run_sync(self._write_all, images.pngs, limiter=self._limiter)
        urls = iter(None if name is None else self._url_prefix + name for name in names)
        return _replace(body, urls)

    def _write_all(self, pngs: list[bytes | None]) -> list[str | None]:
        """Runs in a worker thread: write every image, or none."""
        written: list[Path] = []
        names: list[str | None] = []
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            for png in pngs:
                if png is None:
                    names.append(None)
                    continue
                name = f"{uuid.uuid4()}.png"
                self._write_atomically(self.directory / name, png)
                written.append(self.directory / name)
                names.append(name)
        except BaseException as error:
            for path in written:
                path.unlink(missing_ok=True)
            if isinstance(error, OSError):
                raise ImageWriteError(f"{type(error).__name__}: {error}") from error
            raise
        return names

    @staticmethod
    def _write_atomically(path: Path, data: bytes) -> None:
        temporary = path.with_name(f".{path.name}.tmp")
        try:
            with open(temporary, "wb") as handle:
                handle.write(data)
            os.replace(temporary, path)
        except BaseException:
            temporary.unlink(missing_ok=True)
            raise


def _decode_all(values: list[Any]) -> DecodedImages:
    pngs: list[bytes | None] = []
    for value in values:
        if value is not None and not isinstance(value, str):
            raise BadImage(f"image field holds {type(value).__name__}, not a string")
        pngs.append(None if value is None else decode_png(value))
    return DecodedImages(pngs)


def _collect(node: Any, values: list[Any]) -> None:
    """Append every image value in document order (the order `_replace` consumes them)."""
    if isinstance(node, dict):
        for key, value in node.items():
            if url_key_for(key) is not None:
                values.append(value)
            else:
                _collect(value, values)
    elif isinstance(node, list):
        for item in node:
            _collect(item, values)


def _replace(node: Any, urls: Any) -> Any:
    if isinstance(node, dict):
        rewritten = {}
        for key, value in node.items():
            url_key = url_key_for(key)
            if url_key is not None:
                rewritten[url_key] = next(urls)
            else:
                rewritten[key] = _replace(value, urls)
        return rewritten
    if isinstance(node, list):
        return [_replace(item, urls) for item in node]
    return node
