"""`GET /metrics` of a GPU host: the token (or `Authorization: Bearer`), and counts that
match what was sent, read back with `prometheus_client.parser`."""

from __future__ import annotations

from typing import Any

import trio
from prometheus_client.parser import text_string_to_metric_families

from tests.gpu_host.conftest import TOKEN, WAIT_SECONDS, Fifos, auth, fake_model, job_running, post_image, serving

WAIT = WAIT_SECONDS


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


async def _scrape(client: Any, **headers: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = await client.get("/metrics", headers=headers)
    assert response.status_code == 200
    assert response.headers["Content-Type"].startswith("text/plain")
    return _samples(await response.get_data(as_text=True))


async def test_metrics_count_inferences_generation_and_restarts(fifos: Fifos) -> None:
    model = fake_model()
    async with serving(model) as client:
        await model.wait_ready()
        before = await _scrape(client, **auth())
        for _ in range(3):
            await post_image(client, b"ok")  # measure
        await post_image(client, b"fail:1005", "/api/v1/hair/mask")  # ran, answered 1005
        await post_image(client, b"ok", "/api/v1/hair/grow", plans="standard,aggressive")  # two previews
        await post_image(client, b"ok", "/api/v1/hair/grow", gender="robot")  # 1001: never ran

        async with job_running(client, fifos):
            during = await _scrape(client, Authorization=f"Bearer {TOKEN}")  # what Prometheus sends
            await post_image(client, b"ok")  # busy: never ran
        await post_image(client, b"crash")
        with trio.fail_after(WAIT):
            await model.wait_ready()
        after = await _scrape(client, **auth())
    count = "hairgate_host_inference_seconds_count"
    assert (count, (("endpoint", "measure"),)) not in before
    assert after[(count, (("endpoint", "measure"),))] == 3 + 1 + 1  # three, the blocked one, the crash
    assert after[(count, (("endpoint", "mask"),))] == 1
    assert after[(count, (("endpoint", "grow"),))] == 1
    assert before[("hairgate_host_generation_total", (("result", "preview"),))] == 0
    assert after[("hairgate_host_generation_total", (("result", "preview"),))] == 2
    assert after[("hairgate_host_generation_total", (("result", "comfyui"),))] == 0
    assert (before[("hairgate_host_busy", ())], during[("hairgate_host_busy", ())]) == (0, 1)
    assert after[("hairgate_host_busy", ())] == 0
    assert (before[("hairgate_host_model_restarts_total", ())], after[("hairgate_host_model_restarts_total", ())]) == (
        0,
        1,
    )


async def test_metrics_refuse_a_wrong_bearer_token_and_take_bearer_only_there() -> None:
    model = fake_model()
    async with serving(model) as client:
        wrong = await client.get("/metrics", headers={"Authorization": "Bearer not-the-token"})
        bearer_elsewhere = await client.get("/health", headers={"Authorization": f"Bearer {TOKEN}"})
    assert (wrong.status_code, bearer_elsewhere.status_code) == (401, 401)
