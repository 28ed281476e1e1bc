"""Endpoints 4 and 99 on the real gateway process: answered on its own CPU, never by a GPU host.

The GPU hosts here are fakes that are all down (not ready): the gateway must answer 99
anyway, ask the (fake) vision LLM for 4, and keep `/monitor` and forwarding working while
its face workers are saturated.
"""

from __future__ import annotations

import base64
import io

import pytest
import tomlkit
import trio
from PIL import Image
from skimage import data

from shared.contract.envelope import envelope_errors
from tests.edge.e2e.harness import Cluster, measure, wait_until
from tests.fakes.fake_llm import VALID_FEATURES, FakeLLM, serve_fake_llm

SPECIAL_POINTS, FEATURES = "/api/v1/face/special-points", "/api/v1/face/features"
API_KEY = "sk-e2e-3b8f-never-in-a-log"


def astronaut_base64() -> str:
    buffer = io.BytesIO()
    Image.fromarray(data.astronaut()).save(buffer, "JPEG", quality=90)
    return base64.b64encode(buffer.getvalue()).decode()


def add_features_key(cluster: Cluster) -> None:
    document = tomlkit.parse(cluster.secrets_path.read_text())
    document["edge"] = {"features": {"api_key": API_KEY}}
    cluster.secrets_path.write_text(tomlkit.dumps(document))


@pytest.mark.slow
async def test_99_and_4_answer_with_every_gpu_host_down(cluster: Cluster, nursery: trio.Nursery) -> None:
    (fake,) = cluster.start_fakes(1)
    await fake.configure(not_ready=True)
    llm = FakeLLM()
    llm.knobs.api_key = API_KEY
    base_url = await nursery.start(serve_fake_llm, llm)
    add_features_key(cluster)
    features = {"base_url": base_url, "model": "vision-test", "timeout_seconds": 20}
    gateway = cluster.start_gateway(edge={"features": features})
    photo = {"image_base64": astronaut_base64()}
    async with cluster.client(timeout=60) as client:
        assert (await client.get("/monitor")).status_code == 503, "no GPU host is online"
        points = (await client.post(SPECIAL_POINTS, json=photo)).json()
        assert points["code"] == 0, points
        assert set(points["data"]["points"]) >= {"trichion", "glabella", "menton"}
        assert envelope_errors("special-points", points) is None, envelope_errors("special-points", points)
        described = (await client.post(FEATURES, json=photo)).json()
        assert described["code"] == 0, described
        assert described["data"] == {**VALID_FEATURES, "model": "vision-test"}
        no_face = (
            await client.post(SPECIAL_POINTS, json={"image_base64": base64.b64encode(_grey_jpeg()).decode()})
        ).json()
        assert no_face["code"] == 1005
        assert envelope_errors("special-points", no_face) is None
    assert (await fake.stats())["jobs"] == [], "no GPU host saw any of it"
    assert API_KEY not in gateway.log_text()


@pytest.mark.slow
async def test_monitor_and_forwarding_keep_working_while_99_is_saturated(cluster: Cluster) -> None:
    (fake,) = cluster.start_fakes(1)
    cluster.start_gateway(edge={"cpu": {"workers": 1, "start_workers_at_start": True}})
    photo = {"image_base64": astronaut_base64()}
    async with cluster.client(timeout=60) as client:

        async def answered() -> bool:  # the face worker is up
            return (await client.post(SPECIAL_POINTS, json=photo)).json()["code"] == 0

        await wait_until(answered, 60, "the face worker to start")
        done = 0

        async def flood() -> None:
            nonlocal done
            for _ in range(6):
                await client.post(SPECIAL_POINTS, json=photo)
                done += 1

        async with trio.open_nursery() as nursery:
            for _ in range(4):
                nursery.start_soon(flood)
            await trio.sleep(0.5)  # not synchronisation: let the flood build a queue first
            for _ in range(5):
                assert (await client.get("/monitor")).status_code == 200
                assert (await measure(client)).json()["code"] == 0
            assert done < 24, "checked while the flood was still running"
    assert len((await fake.stats())["jobs"]) == 5


def _grey_jpeg() -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (640, 480), (128, 128, 128)).save(buffer, "JPEG")
    return buffer.getvalue()
