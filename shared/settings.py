"""The settings model: one TOML file for both roles, secrets from a second file or the env.

Strict on purpose (hypercorn's loader silently accepts misspelled keys; this one does not):
every key is validated at start, an unknown key or a bad value is an error naming the key,
and units are part of the names. Secrets (`[auth]`, `edge.features.api_key`, `[audit]`) may only come
from the secrets file or the environment, never from the committed settings.toml.
"""

from __future__ import annotations

import ipaddress
import os
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from shared.contract.endpoints import ENDPOINTS

ENV_SHARED_PASSWORD = "HAIRGATE_SHARED_PASSWORD"
ENV_ACCEPT_PASSWORDS = "HAIRGATE_ACCEPT_PASSWORDS"
ENV_AUDIT_POSTGRES_DSN = "HAIRGATE_AUDIT_POSTGRES_DSN"

PositiveSeconds = Annotated[float, Field(gt=0)]


class SettingsError(Exception):
    """Invalid settings; the message is one line that names the key."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)


class AuthSettings(_Section):
    shared_password: str = ""
    accept_passwords: tuple[str, ...] = ()

    @field_validator("accept_passwords")
    @classmethod
    def _no_empty_tokens(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if any(not token for token in value):
            raise ValueError("tokens must not be empty")
        return value


class PoolSettings(_Section):
    workers: tuple[str, ...] = ()
    primary_workers: tuple[str, ...] = ()
    ca_file: str = ""

    @field_validator("workers", "primary_workers")
    @classmethod
    def _http_urls(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for url in value:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"{url!r} is not an http:// or https:// URL")
        return tuple(url.rstrip("/") for url in value)

    @model_validator(mode="after")
    def _primaries_are_workers(self) -> PoolSettings:
        unknown = set(self.primary_workers) - set(self.workers)
        if unknown:
            raise ValueError(f"primary_workers not in workers: {sorted(unknown)}")
        if len(set(self.workers)) != len(self.workers):
            raise ValueError("workers lists the same URL twice")
        return self


class HealthCheckSettings(_Section):
    path: str = "/health"
    interval_seconds: PositiveSeconds = 8
    timeout_seconds: PositiveSeconds = 3
    unhealthy_threshold: int = Field(2, ge=1)
    healthy_threshold: int = Field(1, ge=1)
    cooldown_seconds: float = Field(60, ge=0)


class DispatchSettings(_Section):
    max_inflight: int = Field(64, ge=1)
    queue_wait_seconds: PositiveSeconds = 30
    max_queue_wait_seconds: PositiveSeconds = 590
    request_timeout_seconds: PositiveSeconds = 60
    slow_paths: tuple[str, ...] = Field(default_factory=lambda: tuple(e.path for e in ENDPOINTS.values() if e.slow))
    slow_request_timeout_seconds: PositiveSeconds = 180
    retry_on_failure: bool = True
    max_retries: int = Field(1, ge=0)
    # gateway.md § Scheduling: workers kept free of slow (slow_paths) jobs, and how much
    # later than its arrival a slow request counts when waiters are ordered.
    reserved_fast_workers: int = Field(1, ge=0)
    slow_priority_offset_seconds: float = Field(5, ge=0)


class FailureSettings(_Section):
    """gateway.md § Failure kinds: how long a host that named its failure is kept from jobs,
    and where else a refused client may go (cuda_error uses health_check.cooldown_seconds)."""

    oom_backoff_base_seconds: PositiveSeconds = 1  # cuda_oom: no job for this x 2^n s (n: OOMs in a row)
    timeout_backoff_base_seconds: PositiveSeconds = 0.5  # timeout: this x 2^n s
    backoff_max_seconds: PositiveSeconds = 60  # neither backoff grows past this
    model_load_out_seconds: float = Field(10, ge=0)  # model_load_failed / model_not_loaded: out this long
    alternative_endpoint: str = ""  # X-Alternative-Endpoint on every 1007 (e.g. a low-res site); empty: none


class StaticCleanupSettings(_Section):
    interval_seconds: PositiveSeconds = 600
    max_age_hours: float = Field(72, gt=0)
    max_total_mb: float = Field(2048, gt=0)


class StaticDownloadSettings(_Section):
    """`GET /static/…`: files stream in pieces; these bound who may hold the gateway how long."""

    max_concurrent: int = Field(64, ge=1)  # downloads at once; the next is answered 503 with Retry-After
    # A download whose client takes no piece (64 KiB) for this long is cut and its slot freed;
    # at most 300: the bound on any write of the server (shared.http_server.SEND_LIMIT_SECONDS).
    stall_seconds: float = Field(30, gt=0, le=300)


class IdempotencySettings(_Section):
    enabled: bool = True
    # "auto": PostgreSQL when [audit] postgres_dsn is set (the shared Redis, if named, caching
    # its answers), else the shared Redis when named, else SQLite at `path`.
    store: Literal["auto", "sqlite", "redis", "postgresql"] = "auto"
    path: str = "var/idempotency.sqlite3"
    ttl_hours: float = Field(24, gt=0)
    max_entries: int = Field(100_000, ge=1)


class SharedStateSettings(_Section):
    """Empty `redis_url`: each gateway keeps its own state (SQLite, memory)."""

    redis_url: str = ""
    # A host's lease lives this long unless its forward renews it (every third of it): a gateway
    # that dies frees its hosts this soon. At least 3: a renewal may wait 1 s for Redis and a
    # lease kept for a local hand-over 0.5 s more, and neither may outlast it
    # (edge/pool/host_leases.py); at most 60: longer, a dead gateway blocks a host for minutes again.
    lease_seconds: float = Field(3, ge=3, le=60)

    @field_validator("redis_url")
    @classmethod
    def _redis_scheme(cls, value: str) -> str:
        # Never echo the URL: it may carry a password.
        if value and not value.startswith(("redis://", "rediss://")):
            raise ValueError("must start with redis:// or rediss://")
        return value


IP_BUCKET_FACTOR = 10  # gateway.md § Rate limiting: the IP bucket's default beside key_header


class RateLimitSettings(_Section):
    enabled: bool = True
    # Generous: many phones behind one carrier NAT share an IP. In production set
    # key_header (per API key, docs/edge.md § Rate limiting).
    requests_per_minute: float = Field(120, gt=0)
    burst: int = Field(30, ge=1)
    key_header: str = ""
    # With key_header: the client IP's own bucket, wider (one office or backend, many keys);
    # 0: 10x the key's numbers. Without key_header the IP bucket has the numbers above.
    ip_requests_per_minute: float = Field(0, ge=0)
    ip_burst: int = Field(0, ge=0)
    trusted_proxies: tuple[str, ...] = ("127.0.0.1", "::1")

    @property
    def ip_limits(self) -> tuple[float, int]:
        """The client IP bucket's (requests per minute, burst)."""
        if not self.key_header:
            return self.requests_per_minute, self.burst
        return (
            self.ip_requests_per_minute or IP_BUCKET_FACTOR * self.requests_per_minute,
            self.ip_burst or IP_BUCKET_FACTOR * self.burst,
        )

    @field_validator("trusted_proxies")
    @classmethod
    def _addresses(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for entry in value:
            try:
                ipaddress.ip_network(entry, strict=False)
            except ValueError:
                raise ValueError(f"{entry!r} is not an IP address or network") from None
        return value


class AuditSettings(_Section):
    """The audit trail (audit.md); the PostgreSQL DSN is a secret: `AuditSecrets`."""

    enabled: bool = True
    path: str = "var/audit.sqlite3"  # SQLite, unless [audit] postgres_dsn is set
    gateway_id: int = Field(0, ge=0, le=999)  # in every execution id: distinct per gateway sharing one store
    retention_days: float = Field(30, gt=0)
    gpu_second_usd: float = Field(0.0, ge=0)
    max_pending: int = Field(100_000, ge=1)  # changes held in memory while the store is down


class AuditSecrets(_Section):
    """`[audit]` of the secrets file (or HAIRGATE_AUDIT_POSTGRES_DSN): set, the audit trail is in PostgreSQL."""

    postgres_dsn: str = ""

    @field_validator("postgres_dsn")
    @classmethod
    def _parses(cls, value: str) -> str:
        if value:
            from psycopg import ProgrammingError
            from psycopg.conninfo import conninfo_to_dict

            try:
                conninfo_to_dict(value)
            except ProgrammingError:  # its message quotes the DSN, password included
                raise ValueError("not a PostgreSQL connection string (postgresql://… or key=value …)") from None
        return value


class CpuSettings(_Section):
    """The gateway's own CPU work (endpoint 99, the image checks of endpoint 4)."""

    workers: int = Field(1, ge=1, le=64)  # processes, each with its own face-mesh detector
    # false: start them at the first endpoint 4/99 request instead (a test rig, a small box)
    start_workers_at_start: bool = True


class FeaturesSettings(_Section):
    """Endpoint 4's vision LLM; empty `base_url`: not configured."""

    base_url: str = ""
    model: str = ""
    timeout_seconds: PositiveSeconds = 30
    api_key: str = ""

    @field_validator("base_url")
    @classmethod
    def _http_base_url(cls, value: str) -> str:
        if value and not value.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://")
        return value.rstrip("/")

    @model_validator(mode="after")
    def _model_named(self) -> FeaturesSettings:
        if self.base_url and not self.model:
            raise ValueError("model must be named when base_url is set")
        return self


class EdgeSettings(_Section):
    bind: str = "0.0.0.0:8080"
    public_base_url: str = "http://127.0.0.1:8080"
    static_dir: str = "var/static"
    request_log: str = "var/request_log.jsonl"
    request_log_max_bytes: int = Field(100 * 1024 * 1024, ge=1024)
    max_body_bytes: int = Field(2 * 1024 * 1024, ge=1)
    # A GPU host reads at most 64 KiB of request head; the gateway adds its own headers,
    # so a client's head is capped well below that (else one request ejects every host).
    max_header_bytes: int = Field(16 * 1024, ge=1024, le=32 * 1024)
    body_idle_timeout_seconds: PositiveSeconds = 10  # longest gap between two body chunks
    body_timeout_seconds: PositiveSeconds = 60  # the whole body, however it trickles
    metrics_bind: str = "127.0.0.1:9464"  # empty: no metrics listener
    certfile: str = ""
    keyfile: str = ""
    shared_state: SharedStateSettings = SharedStateSettings()
    rate_limit: RateLimitSettings = RateLimitSettings()
    pool: PoolSettings = PoolSettings()
    health_check: HealthCheckSettings = HealthCheckSettings()
    dispatch: DispatchSettings = DispatchSettings()
    failures: FailureSettings = FailureSettings()
    static_cleanup: StaticCleanupSettings = StaticCleanupSettings()
    static_downloads: StaticDownloadSettings = StaticDownloadSettings()
    idempotency: IdempotencySettings = IdempotencySettings()
    audit: AuditSettings = AuditSettings()
    cpu: CpuSettings = CpuSettings()
    features: FeaturesSettings = FeaturesSettings()

    @field_validator("public_base_url")
    @classmethod
    def _strip_slash(cls, value: str) -> str:
        return value.rstrip("/")


class GpuHostSettings(_Section):
    bind: str = "0.0.0.0:28187"
    device: Literal["auto", "cpu", "cuda"] = "auto"
    bisenet_weights: str = ""
    inference_timeout_seconds: PositiveSeconds = 50  # below edge.dispatch.request_timeout_seconds
    model_load_timeout_seconds: PositiveSeconds = 300  # then the child is killed and started again
    comfyui_url: str = ""
    comfyui_workflow: str = ""
    comfyui_timeout_seconds: PositiveSeconds = 120
    comfyui_probe_interval_seconds: PositiveSeconds = 10  # GET /system_stats: /health checks.comfyui
    comfyui_output_dir: str = ""  # ComfyUI's output directory when it runs on this machine: disk-checked
    min_free_disk_mb: int = Field(1024, ge=0)  # less free on a filesystem the host writes to: /health 503; 0: off
    certfile: str = ""  # with keyfile: serve HTTPS (PEM files)
    keyfile: str = ""
    # Tests only: a file whose lines name failures the model child raises instead of running
    # the analysis, one line per inference (gpu_host.failure_kinds); empty: off.
    simulated_failures_file: str = ""

    @model_validator(mode="after")
    def _tls_files_come_together(self) -> GpuHostSettings:
        if bool(self.certfile) != bool(self.keyfile):
            raise ValueError("certfile and keyfile must be set together (HTTPS) or both left empty")
        return self


class AnalysisSettings(_Section):
    """Input limits and clinical reference ranges (analysis.md); README says where they come from."""

    max_image_bytes: int = Field(15 * 1024 * 1024, ge=1)
    max_image_megapixels: float = Field(52, gt=0)  # checked from the header, before decoding
    min_short_side_px: int = Field(480, ge=1)
    max_long_side_px: int = Field(8192, ge=1)  # a phone's 4000-8000 px photo is analysed, not refused
    # the pixels of all the pictures one answer draws (a /grow draws two per plan at the
    # photo's size): over it the request is refused before any is drawn (1004). 120 MP of
    # PNG at worst 3 bytes a pixel is 360 MB, 480 MB in base64: under the gateway's 512 MiB
    # answer limit; a 20 MP photo's /grow with three plans fits
    max_answer_megapixels: float = Field(120, gt=0)
    max_yaw_degrees: float = Field(15, gt=0, le=90)
    max_pitch_degrees: float = Field(20, gt=0, le=90)
    max_roll_degrees: float = Field(30, gt=0, le=90)  # roll is undone (the face turned upright), not refused
    iris_diameter_mm: float = Field(11.7, gt=0)
    female_forehead_normal_mm: tuple[float, float] = (50, 65)
    female_forehead_high_above_mm: float = 65
    male_forehead_normal_mm: tuple[float, float] = (55, 75)
    male_forehead_high_above_mm: float = 80


class Settings(_Section):
    auth: AuthSettings = AuthSettings()
    audit: AuditSecrets = AuditSecrets()
    edge: EdgeSettings = EdgeSettings()
    gpu_host: GpuHostSettings = GpuHostSettings()
    analysis: AnalysisSettings = AnalysisSettings()

    @model_validator(mode="after")
    def _host_answers_before_the_gateway_gives_up(self) -> Settings:
        # If the gateway's timeout fires first it ejects the host and retries on a second
        # one, which times out the same way: one slow photo takes two hosts offline. The
        # host's own clean 1007 must arrive first. Checked only where one file configures
        # both roles (`hairgate dev`, the shipped settings.toml): a gateway's own file says
        # nothing about its hosts' timeouts (they report theirs in /health, and the
        # gateway warns about a host that leaves no margin), nor a host's about gateways.
        if not {"edge", "gpu_host"} <= self.model_fields_set:
            return self
        dispatch, host = self.edge.dispatch, self.gpu_host
        needed = host.inference_timeout_seconds + timeout_margin_seconds(dispatch.request_timeout_seconds)
        if needed > dispatch.request_timeout_seconds:
            raise ValueError(
                f"gpu_host.inference_timeout_seconds ({host.inference_timeout_seconds:g}) must be at least "
                f"{timeout_margin_seconds(dispatch.request_timeout_seconds):g} s below "
                f"edge.dispatch.request_timeout_seconds ({dispatch.request_timeout_seconds:g})"
            )
        if host.comfyui_url:
            generation = host.inference_timeout_seconds + host.comfyui_timeout_seconds
            if (
                generation + timeout_margin_seconds(dispatch.slow_request_timeout_seconds)
                > dispatch.slow_request_timeout_seconds
            ):
                raise ValueError(
                    f"gpu_host.inference_timeout_seconds + gpu_host.comfyui_timeout_seconds ({generation:g}) must be "
                    f"at least {timeout_margin_seconds(dispatch.slow_request_timeout_seconds):g} s below "
                    f"edge.dispatch.slow_request_timeout_seconds ({dispatch.slow_request_timeout_seconds:g})"
                )
        return self


def timeout_margin_seconds(gateway_timeout_seconds: float) -> float:
    """How much sooner than the gateway a GPU host must give up: reading, encoding, the network."""
    return max(1.0, 0.05 * gateway_timeout_seconds)


# Keys that may only come from the secrets file or the environment.
_SECRET_KEYS = (
    ("auth", "shared_password"), ("auth", "accept_passwords"),
    ("edge", "features", "api_key"), ("audit", "postgres_dsn"),
)  # fmt: skip


def _read_toml(path: Path, what: str) -> dict[str, Any]:
    try:
        with path.open("rb") as handle:
            return tomllib.load(handle)
    except FileNotFoundError:
        raise SettingsError(f"{what} file not found: {path}") from None
    except tomllib.TOMLDecodeError as error:
        raise SettingsError(f"{what} file {path} is not valid TOML: {error}") from None
    except UnicodeDecodeError:
        raise SettingsError(f"{what} file {path} is not UTF-8 text") from None
    except OSError as error:  # unreadable: a reload must refuse it, never end the service
        raise SettingsError(f"{what} file {path} cannot be read: {error.strerror or error}") from None


def _has_key(tree: dict[str, Any], path: tuple[str, ...]) -> bool:
    for part in path:
        if not isinstance(tree, dict) or part not in tree:
            return False
        tree = tree[part]
    return True


def _merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _environment_secrets(environ: dict[str, str]) -> dict[str, Any]:
    auth: dict[str, Any] = {}
    if environ.get(ENV_SHARED_PASSWORD):
        auth["shared_password"] = environ[ENV_SHARED_PASSWORD]
    if environ.get(ENV_ACCEPT_PASSWORDS):
        auth["accept_passwords"] = [t.strip() for t in environ[ENV_ACCEPT_PASSWORDS].split(",") if t.strip()]
    secrets: dict[str, Any] = {"auth": auth} if auth else {}
    if environ.get(ENV_AUDIT_POSTGRES_DSN):
        secrets["audit"] = {"postgres_dsn": environ[ENV_AUDIT_POSTGRES_DSN]}
    return secrets


def _describe(error: ValidationError) -> str:
    first = error.errors()[0]
    key = ".".join(str(part) for part in first["loc"])
    if not key:  # a check across sections: its message names the keys
        return f"invalid settings: {first['msg'].removeprefix('Value error, ')}"
    if first["type"] == "extra_forbidden":
        return f"unknown settings key: {key}"
    # Never echo the value itself: it may be a secret.
    return f"invalid settings key {key}: {first['msg']}"


def default_secrets_path(config_path: Path) -> Path:
    return config_path.parent / "secrets.toml"


def load_settings(
    config_path: str | Path,
    secrets_path: str | Path | None = None,
    environ: dict[str, str] | None = None,
) -> Settings:
    """Load and validate settings; raises SettingsError with one line naming the bad key.

    The secrets file defaults to `secrets.toml` beside the config and may be absent; an
    explicitly named secrets file must exist. Environment variables win over both files.
    """
    config_path = Path(config_path)
    raw = _read_toml(config_path, "settings")
    for key in _SECRET_KEYS:
        if _has_key(raw, key):
            raise SettingsError(
                f"{'.'.join(key)} is a secret: put it in the secrets file or the environment, not in {config_path.name}"
            )
    if secrets_path is not None:
        raw = _merge(raw, _read_toml(Path(secrets_path), "secrets"))
    elif default_secrets_path(config_path).exists():
        raw = _merge(raw, _read_toml(default_secrets_path(config_path), "secrets"))
    raw = _merge(raw, _environment_secrets(dict(os.environ) if environ is None else environ))
    try:
        return Settings.model_validate(raw)
    except ValidationError as error:
        raise SettingsError(_describe(error)) from None


def token_fingerprint(token: str) -> str:
    """How a token may be named in a log: the first 8 hex chars of its SHA-256."""
    import hashlib

    return hashlib.sha256(token.encode()).hexdigest()[:8]
