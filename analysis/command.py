"""`hairgate analyze PHOTO`: one endpoint's analysis in-process, no servers.

stdout carries exactly one JSON document: the endpoint's `data` on success, the error
envelope on failure (exit 2 for input the user must fix, 1 for a system error). An `--out`
that cannot be a writable folder is a usage error (one line on stderr, exit 2) before
anything loads. Every
`*_base64` image is written to `--out` (default: a fresh temporary folder, named on
stderr) as `<photo>.<endpoint>.<json path>.png` and replaced, as the gateway would, by the
`*_url` key, here a `file://` URL. Everything else (MediaPipe's and TF Lite's chatter,
logs) goes to stderr: native libraries write to file descriptor 1 directly, so fd 1 is
pointed at stderr while the models load and run.
"""

from __future__ import annotations

import argparse
import base64
import json
import logging
import os
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from shared.contract import URL_SUFFIX, Code, ContractError, failure, new_request_id, url_key_for
from shared.contract.bodies import parse_options
from shared.logs import configure_logging
from shared.settings import AnalysisSettings, SettingsError, load_settings

from .errors import AnalysisError

EXIT_OK, EXIT_SYSTEM_ERROR, EXIT_BAD_INPUT = 0, 1, 2

log = logging.getLogger("hairgate.analyze")


def _fields(args: argparse.Namespace) -> dict[str, Any]:
    """The endpoint's form fields as a client would send them (text, like multipart)."""
    fields = {"gender": args.gender, "plans": args.plans, "styles": args.styles, "hairline_points": args.points}
    if args.drop_mm is not None:
        fields["drop_mm"] = str(args.drop_mm)
    return fields


def _configuration(args: argparse.Namespace) -> tuple[AnalysisSettings, str, str]:
    """Analysis limits, BiSeNet weights and device: from --config when given, else defaults."""
    if args.config is None:
        return AnalysisSettings(), args.bisenet_weights or "", "auto"
    settings = load_settings(args.config)
    return settings.analysis, args.bisenet_weights or settings.gpu_host.bisenet_weights, settings.gpu_host.device


def _read_photo(path: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as error:
        raise ContractError(Code.INVALID_PARAMETER, f"无法读取图片文件 {path}：{error.strerror or error}") from None


@contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def _analyse(
    endpoint: str, image: bytes, options: dict[str, Any], limits: AnalysisSettings, weights: str, device: str
) -> dict[str, Any]:
    from .endpoints import run_endpoint  # heavy (mediapipe, cv2): only once the input is known good
    from .models import load_models

    with _stdout_to_stderr():
        models = load_models(weights, device)
        try:
            return run_endpoint(endpoint, image, options, models, limits)
        finally:
            models.close()


class ImageWriter:
    """Writes each `*_base64` image as a PNG file and swaps the key for a `*_url` (file://)."""

    def __init__(self, out_dir: str | None, prefix: str) -> None:
        self._out_dir = Path(out_dir) if out_dir is not None else None
        self._prefix = prefix

    def publish(self, value: Any, path: tuple[str, ...] = ()) -> Any:
        if isinstance(value, list):
            return [self.publish(item, (*path, str(index))) for index, item in enumerate(value)]
        if not isinstance(value, dict):
            return value
        published = {}
        for key, item in value.items():
            url_key = url_key_for(key)
            if url_key is None:
                published[key] = self.publish(item, (*path, key))
            else:
                published[url_key] = None if item is None else self._write(item, (*path, url_key[: -len(URL_SUFFIX)]))
        return published

    def _write(self, encoded: str, path: tuple[str, ...]) -> str:
        folder = self._folder()
        target = folder / f"{self._prefix}.{'.'.join(path)}.png"
        partial = target.with_name(f".{target.name}.partial")
        partial.write_bytes(base64.b64decode(encoded))
        partial.replace(target)  # never a half-written PNG under the final name
        return target.resolve().as_uri()

    def _folder(self) -> Path:
        if self._out_dir is None:
            self._out_dir = Path(tempfile.mkdtemp(prefix="hairgate-analyze-"))
            print(f"images written to {self._out_dir}", file=sys.stderr)
        self._out_dir.mkdir(parents=True, exist_ok=True)
        return self._out_dir


def _usable_out_folder(out_dir: str) -> str | None:
    """Why `--out` cannot hold the images (None: it can): checked before minutes of analysis.

    Folders it has to create for the check are removed again: a failed analysis writes
    nothing (the image writer creates them when there is something to write)."""
    folder = Path(out_dir).absolute()
    missing = [path for path in (folder, *folder.parents) if not path.exists()]
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        return f"cannot create the folder ({error.strerror or error})"
    try:
        if not os.access(folder, os.W_OK | os.X_OK):
            return "the folder is not writable"
        return None
    finally:
        for created in missing:  # deepest first
            created.rmdir()


def _print_json(document: Any) -> None:
    print(json.dumps(document, ensure_ascii=False, indent=2))


def _refused(error: ContractError, request_id: str) -> int:
    _print_json(failure(error, request_id))
    return EXIT_SYSTEM_ERROR if error.code == Code.SYSTEM_ERROR else EXIT_BAD_INPUT


def run(args: argparse.Namespace) -> int:
    if args.out is not None and (problem := _usable_out_folder(args.out)) is not None:
        print(f"hairgate analyze: error: --out {args.out}: {problem}", file=sys.stderr)
        return EXIT_BAD_INPUT  # a usage error, like argparse's: nothing on stdout
    configure_logging("INFO")
    request_id = new_request_id()
    try:
        limits, weights, device = _configuration(args)
        options = parse_options(args.endpoint, _fields(args))
        data = _analyse(args.endpoint, _read_photo(args.photo), options, limits, weights, device)
        _print_json(ImageWriter(args.out, f"{Path(args.photo).stem}.{args.endpoint}").publish(data))
        return EXIT_OK
    except AnalysisError as error:
        return _refused(ContractError.refusing(error.kind, error.message), request_id)
    except ContractError as error:
        return _refused(error, request_id)
    except SettingsError as error:
        log.error("settings: %s", error)
    except Exception:
        log.exception("analysis failed (request_id %s)", request_id)
    _print_json(failure(ContractError(Code.SYSTEM_ERROR), request_id))
    return EXIT_SYSTEM_ERROR
