"""The `hairgate` command: one entry point, one sub-command per role.

It sits above the services it starts (tests/test_layout.py: `shared` below everything, the
services above it, `cluster` on top), beside `hairgate dev`'s launcher. Each sub-command's
module is imported only when that sub-command runs, so the gateway never imports torch or
mediapipe and `hairgate --help` loads no model (it reads the endpoint choices from the
contract's registry: ~0.2 s).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from shared.contract.endpoints import ENDPOINTS

# sub-command -> module whose `run(args) -> int` executes it
_COMMANDS = {
    "edge": "edge.main",
    "gpu-host": "gpu_host.main",
    "analyze": "analysis.command",
    "dev": "cluster.dev",
    "audit": "edge.audit.command",
}


def _add_service_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", default="settings.toml", help="settings TOML (default: %(default)s)")
    parser.add_argument("--secrets", default=None, help="secrets TOML (default: secrets.toml beside --config)")
    parser.add_argument("--bind", default=None, help="HOST:PORT, overrides the bind in settings")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hairgate", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)

    _add_service_arguments(commands.add_parser("edge", help="run the public gateway"))
    _add_service_arguments(commands.add_parser("gpu-host", help="run one GPU host"))

    analyze = commands.add_parser("analyze", help="run the analysis of one endpoint on a photo, in-process")
    analyze.add_argument("photo", help="path of a JPEG, PNG or WebP photo")
    analyze.add_argument(
        "--endpoint", choices=[endpoint.name for endpoint in ENDPOINTS.values() if endpoint.analysed], default="measure"
    )
    analyze.add_argument(
        "--out", default=None, help="folder for the PNG images (default: a new temporary folder, named on stderr)"
    )
    analyze.add_argument("--gender", choices=("male", "female", "unknown"), default="unknown")
    analyze.add_argument("--drop-mm", type=float, default=None, help="mark: lower the hairline by this much")
    analyze.add_argument("--points", default=None, help='mark: hairline polyline as JSON, e.g. "[[x,y],[x,y],[x,y]]"')
    analyze.add_argument("--plans", default=None, help="grow: comma-separated plans")
    analyze.add_argument("--styles", default=None, help="hairline: comma-separated styles")
    analyze.add_argument("--config", default=None, help="settings TOML for the analysis limits")
    analyze.add_argument(
        "--bisenet-weights", default=None, help="BiSeNet state dict (default: the bundled hair network)"
    )

    dev = commands.add_parser("dev", help="the whole system on this machine: N GPU hosts + one gateway")
    dev.add_argument("--workers", type=int, default=2, help="number of GPU hosts (default: %(default)s)")
    dev.add_argument(
        "--config",
        default="settings.toml",
        help=(
            "base settings TOML, copied to var/dev/settings.toml with the dev pool, binds, URLs and limits"
            " (default: %(default)s)"
        ),
    )
    dev.add_argument("--port", type=int, default=8080, help="gateway port (default: %(default)s)")
    dev.add_argument(
        "--first-worker-port",
        type=int,
        default=28187,
        help="port of the first GPU host; the others take the next ones (default: %(default)s)",
    )
    dev.add_argument(
        "--metrics-port",
        type=int,
        default=9464,
        help="gateway Prometheus /metrics port on 127.0.0.1, 0: no metrics listener (default: %(default)s)",
    )

    from edge.audit.command import add_arguments as add_audit_arguments  # its options live with it

    add_audit_arguments(commands.add_parser("audit", help="read the audit trail: show, key, retries, failures"))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    module = importlib.import_module(_COMMANDS[args.command])
    return int(module.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
