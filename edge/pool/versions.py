"""When the pool's online hosts run more than one model version, and what to log about it.

During a rolling upgrade some hosts answer with the new analysis and some with the old: the
same photo measured twice may get two figures, a retry may draw another picture (seed 002
§6.2). That is expected for the minutes an upgrade takes and wrong if it lasts, so an
operator must hear of it while it lasts: `MixedVersions.observe` says so (a WARNING) when
the pool turns mixed, when the mix changes, and every `REMINDER_SECONDS` while it stays
mixed, and once (INFO) when the pool runs one version again. Pure: `now` is passed in, the
caller logs what it returns (`edge.pool.prober`, after each round of probes).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

# How often an unchanged mix is said again: an upgrade takes minutes, a forgotten host stays.
REMINDER_SECONDS = 600.0

Versions = tuple[tuple[str, int], ...]  # (version, online hosts), sorted: `PoolStatistics.model_versions`


@dataclass(frozen=True)
class Notice:
    """A line for the log: its level and its message."""

    level: int
    message: str


class MixedVersions:
    """Remembers the last mix it reported, so that a steady pool logs nothing."""

    def __init__(self) -> None:
        self._reported: Versions = ()
        self._reported_at = -math.inf

    def observe(self, versions: Versions, now: float) -> Notice | None:
        """What to log about the pool's versions now, if anything."""
        if len(versions) < 2:
            was_mixed = len(self._reported) > 1
            self._reported, self._reported_at = versions, -math.inf
            if was_mixed and versions:
                return Notice(logging.INFO, f"Worker 模型版本已一致 | model_version={versions[0][0]}")
            return None
        if versions == self._reported and now - self._reported_at < REMINDER_SECONDS:
            return None
        self._reported, self._reported_at = versions, now
        mix = ", ".join(f"{version} ×{count}" for version, count in versions)
        return Notice(
            logging.WARNING,
            f"Worker 模型版本不一致：同一请求在不同主机上的结果可能不同，升级完成前属正常 | versions={mix}",
        )
