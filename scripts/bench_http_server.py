#!/usr/bin/env python3
"""What `shared.http_server` costs per request: Hypercorn's own classes against ours, in one run.

    scripts/bench_http_server.py [--requests 2000] [--blocks 10] [--answer-bytes 200]

One process serves a trivial ASGI app with Hypercorn on loopback and is its own client:
a kept-alive connection sends `--requests` small GETs one after another, in blocks that
alternate between Hypercorn's `H11Protocol` + `TCPServer` and `HTTP1Protocol` +
`ContainedTCPServer` (a new connection picks the classes installed when it was accepted),
so machine noise hits both alike. It prints the process's CPU time and the wall time per
request of each; the client's share is the same in both.
"""

from __future__ import annotations

import argparse
import statistics
import time
from functools import partial
from typing import cast

import hypercorn.protocol
import hypercorn.trio
import hypercorn.trio.run
import trio
from hypercorn.config import Config
from hypercorn.protocol.h11 import H11Protocol
from hypercorn.trio.tcp_server import TCPServer
from hypercorn.typing import ASGIFramework, ASGIReceiveCallable, ASGISendCallable, ASGISendEvent, Scope

from shared.http_server import ContainedTCPServer, HTTP1Protocol, http1_only

REQUEST = b"GET /ok HTTP/1.1\r\nHost: bench\r\n\r\n"
CLASSES = {"hypercorn": (H11Protocol, TCPServer), "http_server": (HTTP1Protocol, ContainedTCPServer)}


def app_answering(answer: bytes) -> ASGIFramework:
    async def app(scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        start = {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-length", str(len(answer)).encode())],
        }
        await send(cast(ASGISendEvent, start))
        await send(cast(ASGISendEvent, {"type": "http.response.body", "body": answer}))

    return app


async def block(port: int, requests: int, answer_bytes: int) -> None:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        for _ in range(requests):
            await stream.send_all(REQUEST)
            received = b""
            while not (received.endswith(b"x" * min(answer_bytes, 16)) and b"\r\n\r\n" in received):
                received += await stream.receive_some(65536)


async def main(args: argparse.Namespace) -> None:
    config = http1_only(Config())
    config.bind = ["127.0.0.1:0"]
    config.accesslog = None
    stop = trio.Event()
    cpu: dict[str, list[float]] = {name: [] for name in CLASSES}
    wall: dict[str, list[float]] = {name: [] for name in CLASSES}
    async with trio.open_nursery() as nursery:
        serve = partial(
            hypercorn.trio.serve, app_answering(b"x" * args.answer_bytes), config, shutdown_trigger=stop.wait
        )
        port = int((await nursery.start(serve))[0].rsplit(":", 1)[1])
        await block(port, 200, args.answer_bytes)  # warm-up
        for index in range(args.blocks * len(CLASSES)):
            name = list(CLASSES)[index % len(CLASSES)]
            hypercorn.protocol.H11Protocol, hypercorn.trio.run.TCPServer = CLASSES[name]  # type: ignore[misc]
            started_cpu, started_wall = time.process_time(), time.perf_counter()
            await block(port, args.requests, args.answer_bytes)
            cpu[name].append((time.process_time() - started_cpu) / args.requests * 1e6)
            wall[name].append((time.perf_counter() - started_wall) / args.requests * 1e6)
        stop.set()
    print(
        f"{args.requests} requests x {args.blocks} blocks each, answers of {args.answer_bytes} bytes (median of blocks)"
    )
    for name in CLASSES:
        print(
            f"    {name:<12} CPU {statistics.median(cpu[name]):7.1f} us/request   "
            f"wall {statistics.median(wall[name]):7.1f} us/request"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--blocks", type=int, default=10)
    parser.add_argument("--answer-bytes", type=int, default=200)
    trio.run(main, parser.parse_args())
