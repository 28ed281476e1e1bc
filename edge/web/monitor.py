"""The gateway's own health answers and the monitor drill (seed 001 §4 and §9).

Pure functions of a `PoolStatistics` snapshot: they read memory only, never call a
worker, and never reveal worker addresses, tokens or queue depth.
"""

from __future__ import annotations

import json
from typing import Any

from edge.pool.pool import PoolStatistics

SERVICE = "gateway"
MSG_NO_WORKER = "没有可用的 worker"
MSG_DRILL = "模拟故障:监控测试中,真实 worker 未摘除"
MSG_DRILL_NO_WORKER = "模拟故障:监控测试中;当前没有可用的 worker"
MSG_DRILL_ENABLED = "已开启模拟故障,GET /monitor 将返回 503"
MSG_DRILL_DISABLED = "已关闭模拟故障,GET /monitor 恢复真实状态"
MSG_BAD_TOKEN = "X-Internal-Token 缺失或错误"
MSG_BAD_FAULT_BODY = '请求体必须是 JSON 对象 {"enabled": true} 或 {"enabled": false}'

_COUNT_FIELDS = ("workers_total", "workers_healthy", "workers_primary_total", "workers_primary_healthy")


class FaultRequestError(ValueError):
    """The drill request body is not exactly `{"enabled": <bool>}`."""


def _counts(stats: PoolStatistics) -> dict[str, int]:
    return {name: getattr(stats, name) for name in _COUNT_FIELDS}


def health() -> dict[str, str]:
    """`GET /health`: the process is alive; always 200."""
    return {"status": "ok", "service": SERVICE}


def gateway_health(stats: PoolStatistics) -> dict[str, Any]:
    """`GET /gateway-health`: always 200, with the pool counts for a human."""
    return {
        **health(),
        "workers_total": stats.workers_total,
        "workers_healthy": stats.workers_healthy,
        "workers_busy": stats.workers_busy,
        "workers_primary_total": stats.workers_primary_total,
        "workers_primary_healthy": stats.workers_primary_healthy,
        # online hosts that can draw: ComfyUI "ok", or the built-in preview (gateway.md § Capabilities)
        "workers_generation_ready": stats.workers_generation_ready,
        # online hosts by the model version they run: two or more while an upgrade is under way
        "model_versions": dict(stats.model_versions),
    }


def monitor(stats: PoolStatistics) -> tuple[int, dict[str, Any]]:
    """`GET /monitor`: 200 while a worker is online and no drill is on, else 503."""
    if stats.drill:
        message = MSG_DRILL if stats.workers_healthy else MSG_DRILL_NO_WORKER
        body = {"status": "unhealthy", "service": SERVICE, **_counts(stats), "simulated": True, "message": message}
        return 503, body
    if stats.workers_healthy == 0:
        return 503, {"status": "unhealthy", "service": SERVICE, **_counts(stats), "message": MSG_NO_WORKER}
    return 200, {"status": "ok", "service": SERVICE, **_counts(stats)}


def parse_fault_request(raw: bytes) -> bool:
    """The drill switch from a `POST /monitor/fault` body; strict: only a JSON boolean."""
    try:
        body = json.loads(raw, object_pairs_hook=_refuse_duplicate_keys)
    except (ValueError, RecursionError):  # RecursionError: nesting deeper than the parser goes
        raise FaultRequestError("malformed JSON") from None
    if not isinstance(body, dict) or set(body) != {"enabled"} or not isinstance(body["enabled"], bool):
        raise FaultRequestError('body is not exactly {"enabled": <bool>}')
    return body["enabled"]


def _refuse_duplicate_keys(pairs: list[tuple[str, object]]) -> dict[str, object]:
    # {"enabled": false, "enabled": true} must not mean whichever came last
    if len({key for key, _ in pairs}) != len(pairs):
        raise FaultRequestError("duplicate key")
    return dict(pairs)


def fault_answer(enabled: bool) -> dict[str, Any]:
    return {"status": "ok", "simulated": enabled, "message": MSG_DRILL_ENABLED if enabled else MSG_DRILL_DISABLED}


def error_answer(message: str) -> dict[str, str]:
    return {"status": "error", "message": message}
