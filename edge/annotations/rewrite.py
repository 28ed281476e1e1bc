"""The image rewrite: every `*_base64` PNG in a worker's answer becomes a file and a URL.

Workers never write files or build URLs (contract.md § Images in responses). For each key
ending in `_base64`, at any depth in objects and arrays, the gateway decodes the value,
checks that it is a PNG, writes `<static_dir>/annotations/<uuid4>.png` atomically (temp
file + rename) and replaces the key by its `_url` twin. `null` stays `null` and writes
nothing. Two steps, so that a worker that sent a bad image is judged while its lease is
still held and the (slower) file writes happen after the worker is free again:
`decode()` checks every image (`BadImage`: a worker failure), `write()` stores them
all or none (`ImageWriteError`: the gateway's own file system or its store's cap, never
the worker's fault).

Memory: the images are never all decoded at once. `decode()` decodes each image's base64
one piece (`BASE64_PIECE_CHARS`) at a time to check it and keeps only its size; `write()`
decodes it again, piece by piece, into its file. Beyond the parsed answer a rewrite holds
one piece, whatever the images' total (a second decoding pass is the price). The answer's
images together may take at most `ANSWER_SHARE` of the store's cap (`WriteCap`), which is
made room for, oldest files first, before they are written. The walks over the answer are
iterative: no depth is a RecursionError.
"""

from __future__ import annotations

import base64
import binascii
import os
import uuid
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from edge.annotations.static_cleanup import ANNOTATIONS, WriteCap
from shared.contract import BASE64_SUFFIX, url_key_for

__all__ = ["ANNOTATIONS", "BadImage", "DecodedImages", "ImageStore", "ImageWriteError", "has_images"]

_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_PNG_END = b"\x00\x00\x00\x00IEND\xaeB`\x82"  # the empty IEND chunk and its CRC
_PNG_HEAD_BYTES = 33  # signature, IHDR length, type, data and CRC
_BASE64_KEY_MARK = (BASE64_SUFFIX + '"').encode()
BASE64_PIECE_CHARS = 1024 * 1024  # a multiple of 4: 768 KiB decoded per step
_MB = 1024 * 1024


class BadImage(Exception):
    """The worker sent an image that is not valid base64 of a PNG: a worker failure."""


class ImageWriteError(Exception):
    """Writing the annotation files failed on the gateway's own file system (full disk, …),
    or the answer's images are more than the store may take for one answer."""


@dataclass(frozen=True)
class DecodedImages:
    """What `decode()` checked: each image field's decoded size in document order, None
    where the field is null. The bytes themselves are decoded again as they are written."""

    sizes: list[int | None]

    @property
    def total_bytes(self) -> int:
        return sum(size or 0 for size in self.sizes)


def has_images(raw: bytes) -> bool:
    """Cheap pre-check on the raw JSON: most answers have no `_base64` key at all."""
    return _BASE64_KEY_MARK in raw


def check_png(head: bytes, tail: bytes) -> None:
    """Signature, a well-formed IHDR chunk with a matching CRC (in `head`, the first 33
    bytes), and the final IEND chunk (`tail`, the last 12).

    Cheap checks that catch what a broken worker sends (other formats, truncation)
    without decoding the image.
    """
    if not head.startswith(_PNG_SIGNATURE) or len(head) < _PNG_HEAD_BYTES or head[12:16] != b"IHDR":
        raise BadImage("not a PNG")
    if int.from_bytes(head[29:33], "big") != zlib.crc32(head[12:29]):
        raise BadImage("PNG header CRC mismatch")
    if tail != _PNG_END:
        raise BadImage("PNG is truncated (no IEND chunk)")


def _pieces(value: str) -> Iterator[bytes]:
    """`value`'s base64 decoded one piece at a time; BadImage when it is not base64."""
    for start in range(0, len(value), BASE64_PIECE_CHARS):
        piece = value[start : start + BASE64_PIECE_CHARS]
        if piece.endswith("=") and start + BASE64_PIECE_CHARS < len(value):
            raise BadImage("invalid base64")  # padding before the end (b64decode sees one piece)
        try:
            yield base64.b64decode(piece, validate=True)
        except (binascii.Error, ValueError):
            raise BadImage("invalid base64") from None


def checked_size(value: Any) -> int:
    """The decoded size of a valid base64 PNG; BadImage otherwise. One piece in memory."""
    if not isinstance(value, str):
        raise BadImage(f"image field holds {type(value).__name__}, not a string")
    head, tail, size = b"", b"", 0
    for data in _pieces(value):
        if len(head) < _PNG_HEAD_BYTES:
            head += data[: _PNG_HEAD_BYTES - len(head)]
        tail = (tail + data)[-len(_PNG_END) :]
        size += len(data)
    check_png(head, tail)
    return size


class ImageStore:
    """Writes annotation PNGs under `static_dir` and names their public URLs.

    `max_total_mb`: `static_cleanup.max_total_mb`, held at write time (`WriteCap`); None
    holds nothing but the sweep's."""

    def __init__(
        self,
        static_dir: str | Path,
        public_base_url: str,
        limiter: trio.CapacityLimiter,
        max_total_mb: float | None = None,
    ) -> None:
        self.directory = Path(static_dir) / ANNOTATIONS
        self._url_prefix = f"{public_base_url.rstrip('/')}/static/{ANNOTATIONS}/"
        self._limiter = limiter
        self._cap = None if max_total_mb is None else WriteCap(self.directory, max_total_mb)

    async def decode(self, body: Any) -> DecodedImages:
        """Every image of `body`, checked; raises BadImage (in a thread: base64 of megabytes)."""
        values = [parent[key] for parent, key in _image_fields(body)]
        if not values:
            return DecodedImages([])
        return await trio.to_thread.run_sync(_check_all, values, limiter=self._limiter)

    async def write(self, body: Any, images: DecodedImages) -> Any:
        """`body` with every `*_base64` replaced by its URL (rewritten in place: it is this
        request's own parse); raises ImageWriteError."""
        if not images.sizes:
            return body
        fields = list(_image_fields(body))
        values = [parent[key] for parent, key in fields]
        names = await trio.to_thread.run_sync(self._write_all, values, images, limiter=self._limiter)
        urls = {
            (id(parent), key): None if name is None else self._url_prefix + name
            for (parent, key), name in zip(fields, names, strict=True)
        }
        for parent in {id(parent): parent for parent, _ in fields}.values():
            items = list(parent.items())
            parent.clear()  # rebuilt in the same key order, each image key by its URL twin
            for key, value in items:
                url_key = url_key_for(key)
                parent[key if url_key is None else url_key] = value if url_key is None else urls[(id(parent), key)]
        return body

    def _write_all(self, values: list[str | None], images: DecodedImages) -> list[str | None]:
        """Runs in a worker thread: write every image, or none."""
        written: list[Path] = []
        names: list[str | None] = []
        reserved = 0
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            if self._cap is not None:
                if images.total_bytes > self._cap.per_answer_bytes:
                    raise ImageWriteError(
                        f"the answer's images ({images.total_bytes / _MB:.1f} MB) are more than one answer may"
                        f" take of static_cleanup.max_total_mb ({self._cap.per_answer_bytes / _MB:.1f} MB)"
                    )
                self._cap.reserve(images.total_bytes)  # the oldest files go first
                reserved = images.total_bytes
            for value in values:
                if value is None:
                    names.append(None)
                    continue
                name = f"{uuid.uuid4()}.png"
                self._write_atomically(self.directory / name, value)
                written.append(self.directory / name)
                names.append(name)
        except BaseException as error:
            for path in written:
                path.unlink(missing_ok=True)
            if self._cap is not None and reserved:
                self._cap.release(reserved)
            if isinstance(error, OSError):
                raise ImageWriteError(f"{type(error).__name__}: {error}") from error
            raise
        if self._cap is not None:
            self._cap.wrote(
                [
                    (name, size)
                    for name, size in zip(names, images.sizes, strict=True)
                    if name is not None and size is not None
                ]
            )
        return names

    @staticmethod
    def _write_atomically(path: Path, value: str) -> None:
        temporary = path.with_name(f".{path.name}.tmp")
        try:
            with open(temporary, "wb") as handle:
                for data in _pieces(value):
                    handle.write(data)
            os.replace(temporary, path)
        except BaseException:
            temporary.unlink(missing_ok=True)
            raise


def _check_all(values: list[Any]) -> DecodedImages:
    return DecodedImages([None if value is None else checked_size(value) for value in values])


def _image_fields(body: Any) -> Iterator[tuple[dict[str, Any], str]]:
    """Every (object, key) whose key carries an image, in document order, without recursion."""
    pending: list[Iterator[tuple[dict[str, Any] | None, str | None, Any]]] = [iter([(None, None, body)])]
    while pending:
        entry = next(pending[-1], None)
        if entry is None:
            pending.pop()
            continue
        parent, key, node = entry
        if parent is not None and key is not None and url_key_for(key) is not None:
            yield parent, key
        elif isinstance(node, (dict, list)):
            pending.append(_children(node))


def _children(node: dict[str, Any] | list[Any]) -> Iterator[tuple[dict[str, Any] | None, str | None, Any]]:
    if isinstance(node, dict):
        for key, value in node.items():
            yield node, key, value
    else:
        for item in node:
            yield None, None, item
