"""`scripts/render_dashboard.py` against a stand-in of Prometheus' HTTP API on loopback: it
sends every panel's expression as Grafana would (variables replaced), draws a PNG, and
stops with exit 1 when Prometheus refuses an expression."""

from __future__ import annotations

import importlib.util
import json
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest
from PIL import Image

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "render_dashboard.py"
_spec = importlib.util.spec_from_file_location("render_dashboard", SCRIPT)
assert _spec is not None and _spec.loader is not None
render_dashboard = importlib.util.module_from_spec(_spec)
sys.modules["render_dashboard"] = render_dashboard
_spec.loader.exec_module(render_dashboard)


class FakePrometheus(ThreadingHTTPServer):
    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.queries: list[str] = []
        self.refuse = False

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: FakePrometheus

    def do_GET(self) -> None:
        url = urlparse(self.path)
        query = parse_qs(url.query)["query"][0]
        self.server.queries.append(query)
        body: dict[str, object]
        if self.server.refuse:
            body = {"status": "error", "errorType": "bad_data", "error": "parse error"}
        else:
            start = float(parse_qs(url.query)["start"][0])
            values = [[start + step, str(step % 3)] for step in range(0, 60, 2)]
            body = {
                "status": "success",
                "data": {"resultType": "matrix", "result": [{"metric": {"worker": "0"}, "values": values}]},
            }
        payload = json.dumps(body).encode()
        self.send_response(200 if not self.server.refuse else 400)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def prometheus() -> Iterator[FakePrometheus]:
    server = FakePrometheus()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def test_every_panel_is_queried_as_grafana_would_and_drawn(prometheus: FakePrometheus, tmp_path: Path) -> None:
    out = tmp_path / "dashboard.png"
    code = render_dashboard.main(
        ["--prometheus", prometheus.url, "--start", "1000", "--end", "1060", "--scrape-seconds", "2", "--out", str(out)]
    )
    assert code == 0
    dashboard = json.loads(render_dashboard.DASHBOARD.read_text())
    expected = [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]
    assert len(prometheus.queries) == len(expected)
    assert all("$" not in query for query in prometheus.queries)  # every variable replaced
    assert any("[8s]" in query for query in prometheus.queries)  # $__rate_interval = 4 scrapes
    with Image.open(out) as image:
        assert image.width >= 1000 and image.height > image.width


def test_a_refused_expression_is_exit_1(
    prometheus: FakePrometheus, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prometheus.refuse = True
    code = render_dashboard.main(
        ["--prometheus", prometheus.url, "--start", "1000", "--end", "1060", "--out", str(tmp_path / "x.png")]
    )
    assert code == 1
    assert "Prometheus refused a query" in capsys.readouterr().err
