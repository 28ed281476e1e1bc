"""An httpcore network backend that sends each request in one write.

httpcore writes a request's headers, then its body, as separate socket sends. On a busy
two-core machine each loopback send costs tenths of a millisecond (it wakes the peer),
so the gateway holds writes back and sends them together just before it reads the
answer. Nothing is parsed here: httpcore and h11 still do all of HTTP.
"""

from __future__ import annotations

import ssl
import typing

import httpcore


class CoalescingStream(httpcore.AsyncNetworkStream):
    """Buffers writes until the next read (or TLS start), then sends them as one."""

    def __init__(self, stream: httpcore.AsyncNetworkStream) -> None:
        self._stream = stream
        self._pending: list[bytes] = []

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if buffer:
            self._pending.append(buffer)

    async def _flush(self, timeout: float | None) -> None:
        if self._pending:
            data = b"".join(self._pending)
            self._pending.clear()
            await self._stream.write(data, timeout)

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        await self._flush(timeout)
        return await self._stream.read(max_bytes, timeout)

    async def aclose(self) -> None:
        self._pending.clear()
        await self._stream.aclose()

    async def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.AsyncNetworkStream:
        await self._flush(timeout)
        return CoalescingStream(await self._stream.start_tls(ssl_context, server_hostname, timeout))

    def get_extra_info(self, info: str) -> typing.Any:
        return self._stream.get_extra_info(info)


class CoalescingBackend(httpcore.AsyncNetworkBackend):
    """httpcore's trio backend, with every stream wrapped in a `CoalescingStream`."""

    def __init__(self) -> None:
        self._backend = httpcore.TrioBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: typing.Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        stream = await self._backend.connect_tcp(host, port, timeout, local_address, socket_options)
        return CoalescingStream(stream)

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: typing.Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        return CoalescingStream(await self._backend.connect_unix_socket(path, timeout, socket_options))

    async def sleep(self, seconds: float) -> None:
        await self._backend.sleep(seconds)
