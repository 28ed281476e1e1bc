"""Real certificates for tests on loopback: a `trustme` CA and a server certificate it signed.

`tls_files(directory)` writes them as the services read them (PEM files named in settings:
`edge.certfile`/`keyfile`, `gpu_host.certfile`/`keyfile`, `edge.pool.ca_file`, and the
rotation script's `--ca-file`). Each call makes a new CA, so two calls give a CA that did
not sign the other's server certificate: the "wrong CA" case.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import trustme

SERVER_NAMES = ("127.0.0.1", "localhost", "::1")


@dataclass(frozen=True)
class TlsFiles:
    ca_file: Path  # the CA certificate a client verifies against
    certfile: Path  # the server's certificate chain
    keyfile: Path  # the server's private key


def tls_files(directory: Path, prefix: str = "tls") -> TlsFiles:
    directory.mkdir(parents=True, exist_ok=True)
    authority = trustme.CA()
    server = authority.issue_cert(*SERVER_NAMES)
    files = TlsFiles(directory / f"{prefix}-ca.pem", directory / f"{prefix}-cert.pem", directory / f"{prefix}-key.pem")
    authority.cert_pem.write_to_path(str(files.ca_file))
    server.private_key_pem.write_to_path(str(files.keyfile))
    files.certfile.write_bytes(b"".join(blob.bytes() for blob in server.cert_chain_pems))
    files.keyfile.chmod(0o600)
    return files
