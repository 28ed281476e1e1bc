#!/usr/bin/env python3
"""What `shared.http_server` costs per request: Hypercorn's own classes against ours, in one run;
and, with `--pipelining`, what pipelining clients do to another client's `/health`.

    scripts/bench_http_server.py [--requests 2000] [--blocks 10] [--answer-bytes 200]
    scripts/bench_http_server.py --pipelining [--connections 300] [--pipelined 2000] [--probes 10]
                                 [--target 127.0.0.1:8080]

One process serves a trivial ASGI app with Hypercorn on loopback and is its own client:
a kept-alive connection sends `--requests` small GETs one after another, in blocks that
alternate between Hypercorn's `H11Protocol` + `TCPServer` and `HTTP1Protocol` +
`ContainedTCPServer` (a new connection picks the classes installed when it was accepted),
so machine noise hits both alike. It prints the process's CPU time and the wall time per
request of each; the client's share is the same in both.

`--pipelining`: `--connections` clients each send `--pipelined` GETs at once and read the
answers, while one more client asks `GET /health` on a new connection `--probes` times,
`--probe-every` seconds apart; it prints the probes' latency (median, worst) and the
pipelines' answers per second. Served here twice, by our classes without the turns of
pipelined requests (`PIPELINED_AT_ONCE` unbounded: as before issue 39) and with them; or,
with `--target`, against a running server (a gateway: `make run`), once.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from dataclasses import dataclass
from functools import partial
from typing import cast

import h11
import hypercorn.protocol
import hypercorn.trio
import hypercorn.trio.run
import trio
from hypercorn.config import Config
from hypercorn.protocol.h11 import H11Protocol
from hypercorn.trio.tcp_server import TCPServer
from hypercorn.typing import ASGIFramework, ASGIReceiveCallable, ASGISendCallable, ASGISendEvent, Scope

from shared import http_server
from shared.http_server import ContainedTCPServer, HTTP1Protocol, http1_only

REQUEST = b"GET /ok HTTP/1.1\r\nHost: bench\r\n\r\n"
WARM_UP_REQUESTS = 200
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


@dataclass
class Tally:
    answers: int = 0  # answers the pipelines have read so far


async def pipeline(host: str, port: int, count: int, tally: Tally) -> None:
    """`count` GETs sent at once on one connection; its answers counted as they come (until the
    server closes: Hypercorn's `keep_alive_max_requests` ends a connection at 1,000)."""
    stream = await trio.open_tcp_stream(host, port)
    async with stream:
        await stream.send_all(b"GET /health HTTP/1.1\r\nHost: bench\r\n\r\n" * count)
        tail = b""
        while True:
            try:
                data = await stream.receive_some(65536)
            except trio.BrokenResourceError:
                return
            if not data:
                return
            seen = tail + data
            tally.answers += seen.count(b"HTTP/1.1 ") - tail.count(b"HTTP/1.1 ")
            tail = seen[-8:]  # a status line split between two reads is counted in the next


async def probe(host: str, port: int) -> float:
    """Seconds from a new connection's `GET /health` to the end of its answer."""
    started = time.perf_counter()
    stream = await trio.open_tcp_stream(host, port)
    async with stream:
        client = h11.Connection(h11.CLIENT)
        await stream.send_all(client.send(h11.Request(method="GET", target="/health", headers=[("Host", "bench")])))
        await stream.send_all(client.send(h11.EndOfMessage()))
        while not isinstance(event := client.next_event(), h11.EndOfMessage):
            if event is h11.NEED_DATA:
                client.receive_data(await stream.receive_some(65536))
    return time.perf_counter() - started


async def pipelining(host: str, port: int, args: argparse.Namespace) -> tuple[list[float], float]:
    """The probes' latencies while the pipelines run, and the pipelines' answers per second."""
    latencies: list[float] = []
    tally = Tally()
    started = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(args.connections):
            nursery.start_soon(pipeline, host, port, args.pipelined, tally)
        for _ in range(args.probes):
            await trio.sleep(args.probe_every)  # a pace, not a wait for anything
            latencies.append(await probe(host, port))
        nursery.cancel_scope.cancel()  # the pipelines' rest is not measured
    return latencies, tally.answers / (time.perf_counter() - started)


async def serve_pipelining(args: argparse.Namespace, turns: float) -> tuple[list[float], float]:
    """`pipelining` against our classes on loopback, with `turns` pipelined requests at once."""
    http_server._PIPELINE_TURNS.set(trio.CapacityLimiter(turns))
    config = http1_only(Config())
    config.bind = ["127.0.0.1:0"]
    config.accesslog = None
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        serve = partial(hypercorn.trio.serve, app_answering(b"ok"), config, shutdown_trigger=stop.wait)
        port = int((await nursery.start(serve))[0].rsplit(":", 1)[1])
        measured = await pipelining("127.0.0.1", port, args)
        stop.set()
    return measured


def report_pipelining(name: str, measured: tuple[list[float], float]) -> None:
    latencies, rate = measured
    print(
        f"    {name:<34} /health median {statistics.median(latencies) * 1000:7.1f} ms   "
        f"worst {max(latencies) * 1000:7.1f} ms   pipelines {rate:7.0f} answers/s"
    )


async def main(args: argparse.Namespace) -> None:
    config = http1_only(Config())
    config.bind = ["127.0.0.1:0"]
    config.accesslog = None
    # a block is one connection: past Hypercorn's 1,000 requests on one it was closed, and the
    # client read its empty end forever (the default 2,000 never finished)
    config.keep_alive_max_requests = max(args.requests, WARM_UP_REQUESTS) + 1
    stop = trio.Event()
    cpu: dict[str, list[float]] = {name: [] for name in CLASSES}
    wall: dict[str, list[float]] = {name: [] for name in CLASSES}
    async with trio.open_nursery() as nursery:
        serve = partial(
            hypercorn.trio.serve, app_answering(b"x" * args.answer_bytes), config, shutdown_trigger=stop.wait
        )
        port = int((await nursery.start(serve))[0].rsplit(":", 1)[1])
        await block(port, WARM_UP_REQUESTS, args.answer_bytes)
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


def main_pipelining(args: argparse.Namespace) -> None:
    print(
        f"{args.connections} connections pipelining {args.pipelined} GETs each; "
        f"{args.probes} probes of GET /health, {args.probe_every:g} s apart"
    )
    if args.target:
        host, _, port = args.target.rpartition(":")
        report_pipelining(args.target, trio.run(pipelining, host, int(port), args))
        return
    report_pipelining("pipelined requests unbounded", trio.run(serve_pipelining, args, math.inf))
    name = f"PIPELINED_AT_ONCE = {http_server.PIPELINED_AT_ONCE}"
    report_pipelining(name, trio.run(serve_pipelining, args, http_server.PIPELINED_AT_ONCE))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--blocks", type=int, default=10)
    parser.add_argument("--answer-bytes", type=int, default=200)
    parser.add_argument("--pipelining", action="store_true")
    parser.add_argument("--connections", type=int, default=300)
    parser.add_argument("--pipelined", type=int, default=2000)
    parser.add_argument("--probes", type=int, default=10)
    parser.add_argument("--probe-every", type=float, default=0.5)
    parser.add_argument("--target", help="host:port of a running server (else one is served here, twice)")
    arguments = parser.parse_args()
    if arguments.pipelining:
        main_pipelining(arguments)
    else:
        trio.run(main, arguments)
