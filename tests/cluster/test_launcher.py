"""The launcher's promises, on small real child processes: output as events, stops that always end."""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
from pathlib import Path

import pytest
import tomlkit

from cluster.files import edit_settings, write_secrets
from cluster.launcher import Process, Service, child_env, free_ports, start, start_announcing

SECRET_ENV = ("HAIRGATE_SHARED_PASSWORD", "HAIRGATE_ACCEPT_PASSWORDS")


def python(code: str, name: str = "child") -> Service:
    return Service(name, [sys.executable, "-c", code], url="")


# Prints a line, then waits to be stopped.
SERVING = "print('listening', flush=True); import time; time.sleep(120)"


def test_secrets_file_is_private_from_creation_even_over_a_readable_file(tmp_path: Path) -> None:
    path = tmp_path / "secrets.toml"
    path.write_text("old")
    path.chmod(0o644)
    write_secrets(path, "tok-123")
    assert path.stat().st_mode & 0o777 == 0o600
    assert tomlkit.parse(path.read_text())["auth"] == {"shared_password": "tok-123", "accept_passwords": ["tok-123"]}


def test_edit_settings_merges_tables_key_by_key_and_keeps_comments(tmp_path: Path) -> None:
    path = tmp_path / "settings.toml"
    path.write_text("# why this file\n[edge]\nbind = 'x'\n[edge.pool]\nworkers = ['a']\nprimary_workers = ['a']\n")
    edit_settings(path, {"edge": {"pool": {"workers": ["b", "c"]}, "public_base_url": "http://h"}})
    document = tomlkit.parse(path.read_text())
    assert document["edge"]["pool"] == {"workers": ["b", "c"], "primary_workers": ["a"]}
    assert (document["edge"]["bind"], document["edge"]["public_base_url"]) == ("x", "http://h")
    assert path.read_text().startswith("# why this file")


def test_children_never_inherit_secrets_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in SECRET_ENV:
        monkeypatch.setenv(name, "leaked-secret")
    monkeypatch.setenv("UNRELATED", "kept")
    code = "import os; print(sorted(k for k in os.environ if k.startswith(('HAIRGATE_', 'UNRELATED'))))"
    child = start(python(code), tmp_path / "child.log")
    assert child.wait_exit(30) == 0
    assert child.log_text().strip() == "['UNRELATED']"
    assert all(name not in child_env() for name in SECRET_ENV)


def test_a_line_wakes_its_waiter_and_lands_in_the_log_file(tmp_path: Path) -> None:
    with start(python(SERVING), tmp_path / "child.log") as child:
        match = child.wait_for_log(r"listen\w+", 30)
        assert match.group(0) == "listening"
        assert child.alive()
    assert (tmp_path / "child.log").read_text() == "listening\n"
    assert not child.alive()


def test_waiting_for_a_line_fails_as_soon_as_the_process_exits(tmp_path: Path) -> None:
    child = start(python("print('bye'); raise SystemExit(3)"), tmp_path / "child.log")
    with pytest.raises(RuntimeError, match=r"exited \(3\):\nbye"):
        child.wait_for_log("never printed", 60)


def test_polling_returns_the_first_true_value_and_fails_when_the_process_exits(tmp_path: Path) -> None:
    answers = iter([None, 0, "third"])
    with start(python(SERVING)) as child:
        assert child.poll_until(lambda: next(answers), "a value", 30, interval_s=0) == "third"
    with pytest.raises(RuntimeError, match=r"exited \(-15\) before a value"):
        child.poll_until(lambda: None, "a value", 30)


def test_stop_kills_a_child_that_ignores_sigterm(tmp_path: Path) -> None:
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); " + SERVING
    child = start(python(code))
    child.wait_for_log("listening", 30)
    assert child.stop(signal.SIGTERM, grace_s=0.2) == -signal.SIGKILL


def test_stop_returns_the_exit_code_of_a_graceful_stop_with_its_last_words(tmp_path: Path) -> None:
    code = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *_: (print('stopping cleanly', flush=True), sys.exit(0)))\n" + SERVING
    )
    child = start(python(code), tmp_path / "child.log")
    child.wait_for_log("listening", 30)
    assert child.stop() == 0
    assert child.log_text().splitlines() == ["listening", "stopping cleanly"]


def test_echoed_output_carries_the_service_name(capfd: pytest.CaptureFixture[str]) -> None:
    child = start(python("print('hello'); print('world')", name="gpu-host-1"), echo=True)
    assert child.wait_exit(30) == 0
    assert capfd.readouterr().out == "gpu-host-1 | hello\ngpu-host-1 | world\n"


def test_on_exit_hears_of_a_process_that_ended_on_its_own() -> None:
    ended: list[Process] = []
    heard = threading.Event()

    def on_exit(process: Process) -> None:
        ended.append(process)
        heard.set()

    child = start(python("raise SystemExit(4)"), on_exit=on_exit)
    assert heard.wait(30)
    assert ended == [child] and child.process.returncode == 4


def test_an_announcing_child_is_returned_with_the_url_it_printed(tmp_path: Path) -> None:
    code = "import json; print(json.dumps({'event': 'ready', 'url': 'http://127.0.0.1:1234'}), flush=True); " + SERVING
    child = start_announcing("fake", [sys.executable, "-c", code], tmp_path / "fake.log")
    try:
        assert child.url == "http://127.0.0.1:1234"
    finally:
        child.stop()


def test_an_announcing_child_that_stays_silent_is_killed(tmp_path: Path) -> None:
    code = "import os, time; print(os.getpid(), flush=True); time.sleep(120)"
    with pytest.raises(RuntimeError, match=r"not within 0\.5 s"):
        start_announcing("fake", [sys.executable, "-c", code], tmp_path / "fake.log", timeout_s=0.5)
    pid = int((tmp_path / "fake.log").read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # gone and reaped


def test_free_ports_are_consecutive_and_bindable() -> None:
    ports = free_ports(3)
    assert ports == list(range(ports[0], ports[0] + 3))
    for port in ports:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", port))
