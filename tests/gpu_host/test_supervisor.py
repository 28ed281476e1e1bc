"""The model supervisor as tables of (state, event) -> state, actions; no I/O, no clock."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest

from gpu_host.supervisor import Action, Backoff, Phase, Supervisor

KILL, SPAWN = Action.KILL, Action.SPAWN
LOAD_TIMEOUT = 300.0
Event = Callable[[Supervisor], list[Action]]


def loading(now: float = 0.0) -> Supervisor:
    machine = Supervisor(LOAD_TIMEOUT, Backoff(1.0, 30.0))
    assert machine.start(now) == [SPAWN]
    return machine


def ready() -> Supervisor:
    machine = loading()
    machine.loaded("cpu", "fake", now=2.0)
    return machine


def replacing() -> Supervisor:
    machine = ready()
    machine.inference_failed("inference timed out after 60s (request_id=r1)")
    return machine


def waiting() -> Supervisor:
    machine = loading()
    machine.exited("exit code 3", now=5.0)
    return machine


def failed() -> Supervisor:
    machine = loading()
    machine.refused("weights file not found: /nope/79999_iter.pth")
    return machine


STATES: dict[str, Callable[[], Supervisor]] = {
    "loading": loading,
    "ready": ready,
    "replacing": replacing,
    "waiting": waiting,
    "failed": failed,
}

EVENTS: dict[str, Event] = {
    "loaded": lambda m: m.loaded("cuda:0", "bisenet", now=10.0),
    "refused": lambda m: m.refused("bad weights"),
    "exited": lambda m: m.exited("killed by signal 9", now=10.0),
    "inference_failed": lambda m: m.inference_failed("model process died during an inference"),
    "tick_early": lambda m: m.tick(now=5.5),
    "tick_late": lambda m: m.tick(now=1000.0),
}


@pytest.mark.parametrize(
    ("state", "event", "phase", "actions"),
    [
        ("loading", "loaded", Phase.READY, []),
        ("loading", "refused", Phase.FAILED, [KILL]),
        ("loading", "exited", Phase.WAITING, [KILL]),
        ("loading", "inference_failed", Phase.LOADING, []),
        ("loading", "tick_early", Phase.LOADING, []),
        ("loading", "tick_late", Phase.WAITING, [KILL]),  # the load deadline passed
        ("ready", "loaded", Phase.READY, []),
        ("ready", "exited", Phase.LOADING, [KILL, SPAWN]),  # served, then died: replaced at once
        ("ready", "inference_failed", Phase.REPLACING, [KILL]),
        ("ready", "tick_late", Phase.READY, []),  # a ready child has no deadline
        ("replacing", "exited", Phase.LOADING, [KILL, SPAWN]),
        ("replacing", "inference_failed", Phase.REPLACING, []),
        ("replacing", "tick_late", Phase.REPLACING, []),
        ("waiting", "exited", Phase.WAITING, []),  # the child given up on is gone: nothing new
        ("waiting", "tick_early", Phase.WAITING, []),  # backoff 1 s from t=5 ends at 6
        ("waiting", "tick_late", Phase.LOADING, [SPAWN]),
        ("waiting", "loaded", Phase.WAITING, []),
        ("failed", "exited", Phase.FAILED, []),
        ("failed", "tick_late", Phase.FAILED, []),  # never retried: it needs an operator
        ("failed", "loaded", Phase.FAILED, []),
    ],
)
def test_transitions(state: str, event: str, phase: Phase, actions: list[Action]) -> None:
    machine = STATES[state]()
    assert EVENTS[event](machine) == actions
    assert machine.phase is phase
    assert machine.ready is (phase is Phase.READY)


@pytest.mark.parametrize(
    ("state", "event", "fragment"),
    [
        ("ready", "exited", "exited unexpectedly (killed by signal 9)"),
        ("replacing", "exited", "inference timed out"),  # the reason for the kill, not the kill
        ("loading", "exited", "failed while loading (killed by signal 9)"),
        ("loading", "tick_late", "model load timed out after 300s"),
        ("loading", "refused", "bad weights"),
    ],
)
def test_every_way_out_of_ready_says_why(state: str, event: str, fragment: str) -> None:
    machine = STATES[state]()
    EVENTS[event](machine)
    assert fragment in (machine.message or "")


def test_a_successful_load_clears_the_message_and_reports_the_device() -> None:
    machine = waiting()
    machine.tick(now=100.0)
    machine.loaded("cuda:0", "bisenet", now=101.0)
    assert (machine.message, machine.device, machine.segmenter) == (None, "cuda:0", "bisenet")


def test_failed_starts_in_a_row_back_off_doubling_up_to_the_cap() -> None:
    machine = loading()
    now, delays = 0.0, []
    for _ in range(7):
        machine.exited("exit code 3", now)
        delays.append(machine.deadline - now)
        now = machine.deadline
        assert machine.tick(now) == [SPAWN]
    assert delays == [1, 2, 4, 8, 16, 30, 30]
    assert machine.restarts == 7


def test_a_successful_load_resets_the_backoff() -> None:
    machine = loading()
    machine.exited("exit code 3", now=0.0)
    machine.tick(now=1.0)
    machine.loaded("cpu", "fake", now=2.0)
    machine.exited("killed by signal 9", now=3.0)  # respawned at once
    machine.exited("exit code 3", now=4.0)  # the new one dies while loading: first backoff again
    assert machine.deadline == 5.0


def test_each_spawn_has_its_own_load_deadline() -> None:
    machine = ready()
    machine.exited("killed by signal 9", now=50.0)
    assert machine.deadline == 50.0 + LOAD_TIMEOUT
    assert machine.tick(now=50.0 + LOAD_TIMEOUT - 0.1) == []
    assert machine.tick(now=50.0 + LOAD_TIMEOUT) == [KILL]


def test_a_ready_child_has_no_deadline() -> None:
    assert ready().deadline == math.inf
