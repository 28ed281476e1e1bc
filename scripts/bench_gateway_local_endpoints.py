#!/usr/bin/env python3
"""The real gateway while endpoint 99 is saturated: does `/monitor` stay fast, does forwarding work?

    scripts/bench_gateway_local_endpoints.py [--seconds 10] [--clients 3] [--cpu-workers 1]

Starts one fake GPU worker and the real `hairgate edge` (its face workers up before the
clock starts), then for `--seconds`: `--clients` clients post the astronaut (1024×1024
JPEG, ~1 MP) to endpoint 99 back to back, one client polls `/monitor` every 20 ms, and one
client sends `measure` (forwarded to the fake) every 100 ms. Prints p50/p99 of each.
Everything shares this machine's cores, the clients' cost included.
"""

from __future__ import annotations

import argparse
import base64
import io
import secrets
import sys
import tempfile
import time
from pathlib import Path

import httpx
import trio
from PIL import Image
from skimage import data

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: tests.fakes

from cluster.files import write_secrets
from cluster.launcher import free_port, start_gateway
from scripts.bench_gateway import BODY, summary_ms
from tests.fakes.launch import FakeWorkerProcess, write_gateway_settings

SPECIAL_POINTS, MEASURE = "/api/v1/face/special-points", "/api/v1/hair/measure"


def photo_body() -> dict[str, str]:
    buffer = io.BytesIO()
    Image.fromarray(data.astronaut()).resize((1024, 1024)).save(buffer, "JPEG", quality=90)
    return {"image_base64": base64.b64encode(buffer.getvalue()).decode()}


async def measure_under_load(url: str, seconds: float, clients: int) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {"special-points": [], "monitor": [], "measure": []}
    photo = photo_body()
    async with httpx.AsyncClient(base_url=url, timeout=60) as warm:
        assert (await warm.post(SPECIAL_POINTS, json=photo)).json()["code"] == 0
    deadline = trio.current_time() + seconds

    async def timed(name: str, client: httpx.AsyncClient, method: str, path: str, **kwargs: object) -> None:
        started = time.perf_counter()
        response = await client.request(method, path, **kwargs)
        samples[name].append(time.perf_counter() - started)
        response.raise_for_status()

    async def loop(name: str, method: str, path: str, pause: float, **kwargs: object) -> None:
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            while trio.current_time() < deadline:
                await timed(name, client, method, path, **kwargs)
                await trio.sleep(pause)

    async with trio.open_nursery() as nursery:
        for _ in range(clients):
            nursery.start_soon(lambda: loop("special-points", "POST", SPECIAL_POINTS, 0, json=photo))
        nursery.start_soon(lambda: loop("monitor", "GET", "/monitor", 0.02))
        nursery.start_soon(lambda: loop("measure", "POST", MEASURE, 0.1, json=BODY))
    return samples


async def main(args: argparse.Namespace) -> None:
    token = secrets.token_hex(16)
    with tempfile.TemporaryDirectory() as folder:
        directory = Path(folder)
        fake = FakeWorkerProcess.start(token)
        gateway = None
        try:
            await fake.configure(image="none")
            port = free_port()
            cpu = {"workers": args.cpu_workers, "start_workers_at_start": True}
            config = write_gateway_settings(directory, port, [fake.url], edge={"cpu": cpu})
            gateway = start_gateway(
                config, write_secrets(directory / "secrets.toml", token), port, directory / "gw.log"
            )
            samples = await measure_under_load(gateway.url, args.seconds, args.clients)
        finally:
            if gateway is not None:
                gateway.kill()
            fake.kill()
    print(f"{args.clients} clients on endpoint 99 (1 MP JPEG), {args.cpu_workers} face worker(s), {args.seconds:g} s")
    for name, values in samples.items():
        stats = summary_ms(values)
        print(f"    {name:15} n={len(values):5}  p50 {stats['p50']:8.2f} ms  p99 {stats['p99']:8.2f} ms")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--clients", type=int, default=3)
    parser.add_argument("--cpu-workers", type=int, default=1)
    trio.run(main, parser.parse_args())
