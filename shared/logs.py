"""Process-wide logging set-up for both services: one line per record on stderr."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable


def configure_logging(level: str = "INFO") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)


class FailureLog:
    """Logs a recurring failure at most once per `interval_seconds`, counting the ones it held back.

    For failures that every request would otherwise log (a store down, a generator down):
    one line a minute says what fails and how often, not a screen a second.
    """

    def __init__(
        self,
        logger: logging.Logger,
        what: str,
        interval_seconds: float = 60,
        *,
        level: int = logging.ERROR,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._logger = logger
        self._what = what
        self._interval_seconds = interval_seconds
        self._level = level
        self._clock = clock
        self._last_logged: float | None = None
        self._held_back = 0

    def report(self, failure: BaseException | str) -> None:
        now = self._clock()
        if self._last_logged is not None and now - self._last_logged < self._interval_seconds:
            self._held_back += 1
            return
        reason = f"{type(failure).__name__}: {failure}" if isinstance(failure, BaseException) else failure
        self._logger.log(self._level, "%s | %s | 上次记录后又失败 %d 次", self._what, reason, self._held_back)
        self._last_logged = now
        self._held_back = 0
