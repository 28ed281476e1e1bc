"""Draw the Grafana dashboard `docs/grafana/hairgate.json` as one PNG, from a real Prometheus.

For a machine without Grafana: every panel's PromQL is sent, unchanged but for Grafana's
variables, to Prometheus' `/api/v1/query_range`, and drawn with matplotlib where the
dashboard's grid puts the panel. `$__rate_interval` becomes four scrape intervals (what
Grafana uses at this resolution), `$gateway_job` and `$host_job` match every job.

    .venv/bin/python scripts/render_dashboard.py --prometheus http://127.0.0.1:9090 \\
        --start 1764617000 --end 1764617300 --scrape-seconds 2 --out dashboard.png

Exit 1 when Prometheus refuses an expression (the dashboard is then broken in Grafana too).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

import httpx
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.axes import Axes

DASHBOARD = Path(__file__).resolve().parents[1] / "docs" / "grafana" / "hairgate.json"
GRID_COLUMNS = 24
ROW_HEIGHT_INCHES = 0.42  # one Grafana grid unit (30 px)
_LEGEND_LABEL = re.compile(r"\{\{\s*(\w+)\s*\}\}")
_UNIT_LABELS = {"s": "seconds", "reqps": "req/s", "percentunit": "share", "short": ""}


class QueryRefused(Exception):
    pass


def promql(expression: str, scrape_seconds: float) -> str:
    """The expression as Grafana would send it."""
    return (
        expression.replace("$__rate_interval", f"{int(4 * scrape_seconds)}s")
        .replace("$gateway_job", ".+")
        .replace("$host_job", ".+")
    )


def query_range(client: httpx.Client, expression: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
    answer = client.get("/api/v1/query_range", params={"query": expression, "start": start, "end": end, "step": step})
    body = answer.json()
    if body.get("status") != "success":
        raise QueryRefused(f"{expression}: {body.get('error', answer.text[:200])}")
    return list(body["data"]["result"])


def legend(template: str, labels: dict[str, str]) -> str:
    return _LEGEND_LABEL.sub(lambda match: labels.get(match.group(1), ""), template) or str(labels)


def draw_panel(
    axes: Axes, panel: dict[str, Any], series: list[tuple[str, list[float], list[float]]], start: float, end: float
) -> None:
    unit = panel["fieldConfig"]["defaults"].get("unit", "short")
    axes.set_title(panel["title"], fontsize=9, loc="left")
    if panel["type"] == "stat":
        last = [values[-1] for _, _, values in series if values]
        axes.text(
            0.5,
            0.45,
            f"{sum(last):g}" if last else "–",
            ha="center",
            va="center",
            fontsize=28,
            color="white",
            transform=axes.transAxes,
        )
        axes.set_facecolor("#37872d" if last and sum(last) >= 1 else "#c4162a")
        axes.set_xticks([])
        axes.set_yticks([])
        return
    for name, times, values in series:
        axes.plot([t - start for t in times], values, linewidth=1, label=name)
    if not series:
        axes.text(0.5, 0.5, "no data", ha="center", va="center", color="grey", transform=axes.transAxes)
    axes.set_ylim(bottom=0)
    axes.set_xlim(0, end - start)
    axes.set_xlabel("seconds since the start", fontsize=6, labelpad=1)
    axes.tick_params(labelsize=7)
    axes.set_ylabel(_UNIT_LABELS.get(unit, unit), fontsize=7)
    axes.grid(alpha=0.3)
    if series:
        axes.legend(fontsize=6, loc="upper left", ncol=2 if len(series) > 4 else 1, framealpha=0.6)


def render(prometheus: str, start: float, end: float, scrape_seconds: float, out: Path, title: str) -> None:
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    panels = dashboard["panels"]
    height = max(panel["gridPos"]["y"] + panel["gridPos"]["h"] for panel in panels)
    figure = plt.figure(figsize=(16, height * ROW_HEIGHT_INCHES))
    grid = figure.add_gridspec(height, GRID_COLUMNS, hspace=0.0, wspace=0.0)
    step = max(scrape_seconds, (end - start) / 300)
    with httpx.Client(base_url=prometheus, timeout=30) as client:
        for panel in panels:
            position = panel["gridPos"]
            if panel["type"] == "row":
                axes = figure.add_subplot(grid[position["y"], :])
                axes.axis("off")
                axes.text(0, 0.2, panel["title"], fontsize=11, fontweight="bold", transform=axes.transAxes)
                continue
            cell = grid[position["y"] : position["y"] + position["h"], position["x"] : position["x"] + position["w"]]
            axes = figure.add_subplot(cell)
            series = []
            for target in panel["targets"]:
                for result in query_range(client, promql(target["expr"], scrape_seconds), start, end, step):
                    points = [(float(t), float(v)) for t, v in result["values"] if v not in ("NaN", "+Inf", "-Inf")]
                    series.append(
                        (
                            legend(target["legendFormat"], result["metric"]),
                            [t for t, _ in points],
                            [v for _, v in points],
                        )
                    )
            draw_panel(axes, panel, series, start, end)
    figure.suptitle(title, fontsize=12, x=0.01, y=1 - 0.15 / (height * ROW_HEIGHT_INCHES), ha="left")
    figure.subplots_adjust(left=0.04, right=0.99, top=1 - 0.8 / (height * ROW_HEIGHT_INCHES), bottom=0.02)
    for axes in figure.axes:  # the grid cells abut: leave each panel a margin
        box = axes.get_position()
        axes.set_position((box.x0 + 0.012, box.y0 + 0.012, box.width - 0.018, box.height - 0.02))
    figure.savefig(out, dpi=80)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prometheus", required=True, help="base URL, e.g. http://127.0.0.1:9090")
    parser.add_argument("--start", type=float, required=True, help="unix seconds")
    parser.add_argument("--end", type=float, required=True, help="unix seconds")
    parser.add_argument(
        "--scrape-seconds", type=float, default=15.0, help="Prometheus' scrape interval (default: %(default)s)"
    )
    parser.add_argument("--out", type=Path, required=True, help="the PNG to write")
    parser.add_argument(
        "--title", default="hairgate (docs/grafana/hairgate.json, drawn by scripts/render_dashboard.py)"
    )
    args = parser.parse_args(argv)
    try:
        render(args.prometheus, args.start, args.end, args.scrape_seconds, args.out, args.title)
    except QueryRefused as error:
        print(f"Prometheus refused a query: {error}", file=sys.stderr)
        return 1
    except httpx.HTTPError as error:
        print(f"cannot reach Prometheus at {args.prometheus}: {error}", file=sys.stderr)
        return 1
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
