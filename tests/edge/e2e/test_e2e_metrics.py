"""`/metrics` of the real gateway on its own listener, parsed as Prometheus parses it (gateway.md § Metrics)."""

from __future__ import annotations

from collections import Counter

from shared.contract import HEADER_IDEMPOTENCY_KEY, Code
from tests.edge.e2e.harness import MEASURE, Cluster, measure, metrics_listener, scrape, wait_until
from tests.fakes.fake_worker import PNG_BASE64

MASK = "/api/v1/hair/mask"
# gateway.md § Metrics, as written there (a counter's family is its name without `_total`)
SPEC_NAMES = (
    "hairgate_requests_total",
    "hairgate_request_duration_seconds",
    "hairgate_queue_wait_seconds",
    "hairgate_queue_length",
    "hairgate_workers_online",
    "hairgate_worker_up",
    "hairgate_worker_busy",
    "hairgate_worker_ejections_total",
    "hairgate_retries_total",
    "hairgate_idempotency_total",
    "hairgate_rate_limited_total",
    "hairgate_build_info",
)


def _family(name: str) -> str:
    return name.removesuffix("_total")


async def test_metrics_count_what_was_sent_and_name_workers_by_index(cluster: Cluster) -> None:
    fakes = cluster.start_fakes(2)
    edge, metrics_url = metrics_listener()
    cluster.start_gateway(edge=edge)
    sent: Counter[tuple[str, str]] = Counter()
    async with cluster.client() as client:
        for _ in range(3):
            sent[MEASURE, str((await measure(client)).json()["code"])] += 1
        for _ in range(2):
            sent[MASK, str((await client.post(MASK, json={"image_base64": PNG_BASE64})).json()["code"])] += 1
        for _ in range(2):  # stored, then replayed
            sent[MEASURE, str((await measure(client, headers={HEADER_IDEMPOTENCY_KEY: "m-1"})).json()["code"])] += 1
        for fake in fakes:
            await fake.configure(fail_all=True, fail_status=502)
        for _ in range(2):
            sent[MEASURE, str((await measure(client)).json()["code"])] += 1
        public = await client.get("/metrics")
    assert sent == {(MEASURE, "0"): 5, (MASK, "0"): 2, (MEASURE, str(int(Code.SYSTEM_ERROR))): 2}

    async def all_counted() -> bool:
        families = await scrape(metrics_url)
        return sum(s.value for s in families["hairgate_requests"] if s.name.endswith("_total")) >= sum(sent.values())

    await wait_until(all_counted, 5, "every request in hairgate_requests_total")
    families = await scrape(metrics_url)
    assert {_family(name) for name in SPEC_NAMES} <= set(families), set(map(_family, SPEC_NAMES)) - set(families)

    counted = {
        (s.labels["path"], s.labels["code"]): s.value
        for s in families["hairgate_requests"]
        if s.name.endswith("_total")
    }
    assert counted == sent
    durations = {
        s.labels["path"]: s.value for s in families["hairgate_request_duration_seconds"] if s.name.endswith("_count")
    }
    assert durations == {MEASURE: 7, MASK: 2}
    idempotency = {s.labels["result"]: s.value for s in families["hairgate_idempotency"] if s.name.endswith("_total")}
    assert (idempotency.get("stored"), idempotency.get("replayed")) == (1, 1)
    ejected = {s.labels["worker"] for s in families["hairgate_worker_ejections"] if s.name.endswith("_total")}
    assert ejected == {"0", "1"}, "both workers failed a request with 502"
    worker_labels = {s.labels["worker"] for f in families.values() for s in f if "worker" in s.labels}
    assert worker_labels == {"0", "1"}, "workers are labelled by index, never by URL"
    assert [s.value for s in families["hairgate_build_info"]] == [1]
    assert public.status_code == 404, "the public port does not serve /metrics"
    assert "hairgate_" not in public.text
