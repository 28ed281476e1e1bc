"""The model child's main loop: the only code on a GPU host that imports torch and mediapipe.

Started by `gpu_host.model_process` with the `spawn` start method (a fresh interpreter: no
inherited locks, threads or CUDA state). It loads the models, says `Ready` (or `LoadFailed`),
then answers `Ping` and `Infer` messages one at a time until its pipe closes.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from analysis.errors import AnalysisError
from gpu_host.failure_kinds import as_contract_error, fail_load_if_simulated, raise_simulated
from gpu_host.protocol import ChildConfig, Failure, Infer, LoadFailed, Ping, Pong, Ready, Result
from shared.contract import ContractError, ErrorType
from shared.logs import configure_logging

log = logging.getLogger("gpu_host.child")


def prepare_child_process() -> None:
    """Process set-up shared by every child entry point (the real one and test fakes).

    Ctrl-C in a terminal reaches the whole process group: the child ignores it and lets the
    web process shut it down in order. It also dies with its parent (Linux), so a killed web
    process never leaves a model holding the GPU.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        import ctypes

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:  # not Linux / no glibc: EOF on the pipe still ends an idle child
        pass


def serve(conn: Connection, config: ChildConfig) -> None:
    """Child entry point: load, report, then serve requests until the pipe closes."""
    prepare_child_process()
    configure_logging()
    fail_load_if_simulated(config.simulated_failures_file)  # the tests' switch; off in production
    try:
        from analysis.endpoints import run_endpoint
        from analysis.models import load_models

        models = load_models(config.bisenet_weights, config.device)
    except Exception as error:  # any load problem is reported, not raised: /health shows it
        log.exception("model load failed")
        conn.send(LoadFailed(message=str(error) or type(error).__name__))
        return
    conn.send(Ready(device=str(models.device), segmenter=str(models.segmenter.name)))

    def handle(message: Infer) -> dict[str, Any]:
        raise_simulated(config.simulated_failures_file)  # the tests' switch; off in production
        return run_endpoint(message.endpoint, message.image, message.options, models, config.limits)

    answer_requests(conn, handle)


def answer_requests(conn: Connection, handle: Callable[[Infer], dict[str, Any]]) -> None:
    """Answer Ping and Infer messages in order until the pipe closes (the loop of every child)."""
    while True:
        try:
            message = conn.recv()
        except EOFError:  # the web process closed the pipe or died
            return
        if isinstance(message, Ping):
            conn.send(Pong())
        elif isinstance(message, Infer):
            conn.send(_answer(message, handle))
        else:
            log.error("unknown message %r; ignored", type(message).__name__)


def _answer(message: Infer, handle: Callable[[Infer], dict[str, Any]]) -> Result | Failure:
    """Run one inference; every exception becomes a Failure (code + message + its kind,
    `gpu_host.failure_kinds`), never a pickle. The analysis' refusal of the photo or its
    options is answered with the contract's code for its kind, `input_rejected`."""
    try:
        return Result(request_id=message.request_id, data=handle(message))
    except AnalysisError as error:
        return _failure(message, ContractError.refusing(error.kind, error.message), ErrorType.INPUT_REJECTED)
    except Exception as error:
        answer = as_contract_error(error)
        log.exception(
            "inference failed | request_id=%s endpoint=%s error_type=%s",
            message.request_id,
            message.endpoint,
            answer.error_type,
        )
        return _failure(message, answer, answer.error_type)


def _failure(message: Infer, error: ContractError, kind: ErrorType | None) -> Failure:
    return Failure(
        request_id=message.request_id,
        code=int(error.code),
        message=error.message,
        error_type=None if kind is None else kind.value,
    )
