"""Endpoint 99 (`POST /api/v1/face/special-points`), answered by the gateway on its own CPU.

The face mesh runs in the gateway's face workers (`edge.local.face_workers`), never on a GPU host,
so it answers while every host is down. Validation and messages are the GPU host's
(`edge.local.face_jobs`); `trichion` is the top of the landmark mesh, not a hairline.
"""

from __future__ import annotations

from edge.local import face_jobs
from edge.local.face_workers import FaceWorkers
from edge.local.local_answer import LocalAnswer, answered, refused
from shared.contract import ContractError
from shared.settings import AnalysisSettings

# A busy or broken worker pool frees up within seconds (a job takes ~50 ms).
RETRY_AFTER_SECONDS = 2


class SpecialPoints:
    """Answers endpoint 99; `workers.run()` must be running."""

    def __init__(self, workers: FaceWorkers, limits: AnalysisSettings) -> None:
        self._workers = workers
        self.limits = limits

    def reconfigure(self, limits: AnalysisSettings) -> None:
        """Reloaded limits, for the requests that start from now on."""
        self.limits = limits

    async def answer(self, body: bytes, content_type: str | None, request_id: str) -> LocalAnswer:
        try:
            data = await self._workers.call(request_id, face_jobs.special_points, body, content_type, self.limits)
        except ContractError as error:
            return refused(error, request_id, RETRY_AFTER_SECONDS)
        return answered(request_id, data)
