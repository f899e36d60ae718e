"""Configuration from the ``TOOLGATE_*`` environment variables (docs/configuration.md).

``Settings`` is built once, validated completely, and passed down; nothing else reads the
environment. A bad configuration raises ``ConfigError`` with a message fit for an operator.
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from jwt.algorithms import get_default_algorithms

MIN_SECRET_BYTES = {"HS256": 32, "HS384": 48, "HS512": 64}
"""A shared secret at least as long as its algorithm's hash (RFC 7518, section 3.2)."""
MAX_DAYS = 36500
"""A hundred years of retention: ``now`` minus it stays a date Python can hold."""
MAX_TTL_S = 10 * 365 * 86400
"""Ten years: far beyond any retry, and ``now`` plus it stays a date Python can hold."""
MIN_KNOWN_VALUES_KEY_BYTES = 32
"""An HMAC-SHA256 key as long as its hash."""


class ConfigError(Exception):
    """The configuration cannot work; ``serve`` prints the message and exits non-zero."""


@dataclass(frozen=True)
class Settings:
    catalog_path: Path
    database_url: str | None
    """``None``: the ``toolgate`` command runs the embedded store in ``data_dir``."""
    data_dir: Path
    redis_url: str | None
    redis_prefix: str
    jwt_secret: str | None
    jwt_public_key_file: Path | None
    jwks_url: str | None
    jwt_algorithms: tuple[str, ...]
    jwt_issuer: str | None
    jwt_audience: str | None
    tenant_claim: str
    roles_claim: str
    auditor_role: str
    admin_role: str
    idempotency_ttl_s: int
    audit_signing_key_file: Path | None = None
    """Ed25519 private key (PEM) signing the audit chain's checkpoints; kept off the database."""
    audit_checkpoint_file: Path | None = None
    """Where the audit sealer appends its signed checkpoints (NDJSON), besides its log."""
    retention_days: int = 90
    """Days calls (with their dry-runs and approvals) and runs are kept; 0 keeps them."""
    audit_retention_days: int = 0
    """Days audit rows are kept; 0 (the default) keeps them."""
    audit_archive_dir: Path | None = None
    """Where retention writes each audit month before dropping it; unset, dropped rows are
    gone for good."""
    webhook_retention_days: int = 7
    """Days delivered webhooks are kept; 0 keeps them."""
    cors_origins: tuple[str, ...] = ()
    """Browser origins (``scheme://host[:port]``) whose pages may call the API; none by default."""
    public_url: str | None = None
    """Where people reach this toolgate (``https://toolgate.example.com``, a path prefix
    allowed): links to the console in webhooks are built from it; unset, they are null."""
    oidc_issuer: str | None = None
    """The OpenID provider the console signs approvers in with (``TOOLGATE_OIDC_ISSUER``,
    with ``oidc_client_id``); its ID tokens are verified like any token."""
    oidc_client_id: str | None = None
    """The console's client id at ``oidc_issuer`` (a public client: no secret)."""
    known_values_keys: tuple[bytes, ...] = field(default=(), repr=False)
    """The keys known values are digested under: ``TOOLGATE_KNOWN_VALUES_KEY``, then
    ``TOOLGATE_KNOWN_VALUES_PREVIOUS_KEY`` while a rotation lasts. None: known values are
    off (none endorses, none can be added), and ``serve`` warns."""
    env: Mapping[str, str] = field(default_factory=dict, repr=False)
    """The environment the settings came from; catalog ``${ENV}`` references resolve here."""

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if env is None else env

        def get(name: str) -> str | None:
            value = env.get(f"TOOLGATE_{name}", "").strip()
            if not value.isascii():  # bytes that are not UTF-8 arrive as lone surrogates
                try:
                    value.encode()
                except UnicodeEncodeError:
                    raise ConfigError(f"TOOLGATE_{name} is not valid UTF-8") from None
            return value or None

        secret, public_key, jwks_url = get("JWT_SECRET"), get("JWT_PUBLIC_KEY"), get("JWKS_URL")
        algorithms = get("JWT_ALGORITHMS")
        if algorithms:
            allowed = tuple(a.strip() for a in algorithms.split(",") if a.strip())
        else:
            allowed = ("HS256",) if secret else ("RS256", "ES256", "EdDSA")
        retention = {
            name: _days(f"TOOLGATE_{name}", get(name), default)
            for name, default in (
                ("RETENTION_DAYS", 90),
                ("AUDIT_RETENTION_DAYS", 0),
                ("WEBHOOK_RETENTION_DAYS", 7),
            )
        }
        history, audit = retention["RETENTION_DAYS"], retention["AUDIT_RETENTION_DAYS"]
        if audit and not 0 < history <= audit:
            raise ConfigError(
                "TOOLGATE_AUDIT_RETENTION_DAYS must be 0 (keep) or at least "
                "TOOLGATE_RETENTION_DAYS (which must then be set): the audit trail is kept "
                "longest"
            )
        ttl = get("IDEMPOTENCY_TTL_S") or "86400"
        if not (ttl.isascii() and ttl.isdigit()) or not 0 < int(ttl) <= MAX_TTL_S:
            raise ConfigError(
                "TOOLGATE_IDEMPOTENCY_TTL_S must be a positive number of seconds, at most "
                f"{MAX_TTL_S} (ten years)"
            )
        issuer, audience = get("JWT_ISSUER"), get("JWT_AUDIENCE")
        oidc_issuer, oidc_client = _oidc(get("OIDC_ISSUER"), get("OIDC_CLIENT_ID"), jwks_url)
        if oidc_issuer is not None and issuer not in (None, oidc_issuer):
            raise ConfigError(
                "TOOLGATE_JWT_ISSUER differs from TOOLGATE_OIDC_ISSUER: the console's tokens"
                " come from the OIDC issuer, and are verified as its"
            )
        return cls(
            catalog_path=Path(get("CATALOG") or "catalog/"),
            database_url=_url("TOOLGATE_DATABASE_URL", get("DATABASE_URL")),
            data_dir=Path(get("DATA_DIR") or ".toolgate"),
            redis_url=_url("TOOLGATE_REDIS_URL", get("REDIS_URL"), ("redis", "rediss", "unix")),
            redis_prefix=get("REDIS_PREFIX") or "toolgate:",
            jwt_secret=secret,
            jwt_public_key_file=_path(public_key),
            jwks_url=_jwks_url(jwks_url),
            jwt_algorithms=allowed,
            jwt_issuer=issuer or oidc_issuer,
            jwt_audience=audience or oidc_client,
            tenant_claim=get("TENANT_CLAIM") or "tid",
            roles_claim=get("ROLES_CLAIM") or "roles",
            auditor_role=get("AUDITOR_ROLE") or "auditor",
            admin_role=get("ADMIN_ROLE") or "admin",
            idempotency_ttl_s=int(ttl),
            audit_signing_key_file=_path(get("AUDIT_SIGNING_KEY")),
            audit_checkpoint_file=_path(get("AUDIT_CHECKPOINT_FILE")),
            retention_days=history,
            audit_retention_days=audit,
            audit_archive_dir=_path(get("AUDIT_ARCHIVE_DIR")),
            webhook_retention_days=retention["WEBHOOK_RETENTION_DAYS"],
            cors_origins=_origins(get("CORS_ORIGINS")),
            public_url=_public_url(get("PUBLIC_URL")),
            oidc_issuer=oidc_issuer,
            oidc_client_id=oidc_client,
            known_values_keys=_known_values_keys(
                get("KNOWN_VALUES_KEY"), get("KNOWN_VALUES_PREVIOUS_KEY")
            ),
            env=dict(env),
        )

    def check_keys(self) -> None:
        """Refuse a key configuration that cannot verify tokens safely."""
        sources = [s for s in (self.jwt_secret, self.jwt_public_key_file, self.jwks_url) if s]
        if len(sources) != 1:
            raise ConfigError(
                "set exactly one of TOOLGATE_JWT_SECRET, TOOLGATE_JWT_PUBLIC_KEY, "
                f"TOOLGATE_JWKS_URL (found {len(sources)})"
            )
        if "none" in {a.lower() for a in self.jwt_algorithms}:
            raise ConfigError("TOOLGATE_JWT_ALGORITHMS must not contain 'none'")
        if not self.jwt_algorithms:
            raise ConfigError("TOOLGATE_JWT_ALGORITHMS is empty")
        unknown = sorted(set(self.jwt_algorithms) - get_default_algorithms().keys())
        if unknown:
            raise ConfigError(f"TOOLGATE_JWT_ALGORITHMS: unknown algorithm {', '.join(unknown)}")
        hmac = {a for a in self.jwt_algorithms if a.startswith("HS")}
        if self.jwt_secret is not None:
            if hmac != set(self.jwt_algorithms):
                raise ConfigError("a shared secret only verifies HS* algorithms")
            least = max(MIN_SECRET_BYTES[a] for a in hmac)
            if len(self.jwt_secret.encode()) < least:
                raise ConfigError(
                    f"TOOLGATE_JWT_SECRET must be at least {least} bytes (for "
                    f"{', '.join(sorted(hmac))})"
                )
        elif hmac:
            raise ConfigError("HS* algorithms need TOOLGATE_JWT_SECRET, not a public key")
        key_file = self.jwt_public_key_file
        if key_file is not None and not _looked_up(
            "TOOLGATE_JWT_PUBLIC_KEY", key_file, Path.is_file
        ):
            raise ConfigError(f"TOOLGATE_JWT_PUBLIC_KEY: no such file {key_file}")

    def check_audit_paths(self) -> None:
        """Refuse an audit archive directory or checkpoint file that cannot be written: a
        start would look fine, then every month would be kept, or every checkpoint go to the
        log only, each pass logging an error."""
        checkpoints = self.audit_checkpoint_file
        if (
            checkpoints is not None
            and _looked_up("TOOLGATE_AUDIT_CHECKPOINT_FILE", checkpoints, Path.exists)
            and not (checkpoints.is_file() and os.access(checkpoints, os.W_OK))
        ):
            raise ConfigError(
                f"TOOLGATE_AUDIT_CHECKPOINT_FILE: {checkpoints} is not a file to write"
            )
        for name, directory in (
            ("TOOLGATE_AUDIT_ARCHIVE_DIR", self.audit_archive_dir),
            ("TOOLGATE_AUDIT_CHECKPOINT_FILE", checkpoints.parent if checkpoints else None),
        ):
            if directory is not None and not (
                _looked_up(name, directory, Path.is_dir) and os.access(directory, os.W_OK | os.X_OK)
            ):
                raise ConfigError(f"{name}: {directory} is not a directory toolgate can write in")

    def check_database(self) -> str:
        if not self.database_url:
            raise ConfigError(
                "TOOLGATE_DATABASE_URL is not set (the toolgate command starts an embedded "
                "store for it; an app run any other way needs a postgresql:// URL)"
            )
        if not self.database_url.startswith(("postgresql://", "postgres://")):
            raise ConfigError("TOOLGATE_DATABASE_URL must be a postgresql:// URL")
        return self.database_url


def _looked_up(name: str, path: Path, test: Callable[[Path], bool]) -> bool:
    """``test(path)``, a path the system refuses to look up (a name too long, a directory
    this user may not search) refused as the configuration ``name`` names."""
    try:
        return test(path)
    except OSError as exc:
        raise ConfigError(f"{name}: {path}: {exc.strerror}") from None


def _days(name: str, value: str | None, default: int) -> int:
    if value is None:
        return default
    if not (value.isascii() and value.isdigit()) or int(value) > MAX_DAYS:
        raise ConfigError(
            f"{name} must be a whole number of days, at most {MAX_DAYS} (0 keeps everything)"
        )
    return int(value)


_ORIGIN = re.compile(r"https?://([A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\])(:[0-9]{1,5})?")


def _origins(value: str | None) -> tuple[str, ...]:
    """Exact origins only: a wildcard would let any web page that holds a user's token drive
    the approval endpoints from its own origin, so ``*`` (and anything with a path) is refused."""
    if value is None:
        return ()
    origins = tuple(o.strip().rstrip("/") for o in value.split(",") if o.strip())
    for origin in origins:
        if not _ORIGIN.fullmatch(origin):
            raise ConfigError(
                f"TOOLGATE_CORS_ORIGINS: {origin!r} is not an origin such as"
                " https://console.example.com (exact origins only; '*' is not allowed)"
            )
    return origins


def _public_url(value: str | None) -> str | None:
    """An ``http(s)://`` URL with a host and no query or fragment, kept without its final
    ``/``: console links are this plus ``/console/…``."""
    url = _url("TOOLGATE_PUBLIC_URL", value, ("https", "http"), host=True)
    if url is None:
        return None
    parts = urlsplit(url)
    if parts.query or parts.fragment or "@" in parts.netloc:
        raise ConfigError("TOOLGATE_PUBLIC_URL must have no user, query or fragment")
    return url.rstrip("/")


def _url(
    name: str, value: str | None, schemes: tuple[str, ...] = (), *, host: bool = False
) -> str | None:
    """A URL the standard parser reads, port included, of one of ``schemes`` when given,
    and naming a host when ``host``: a URL that could never be fetched would start a
    service that fails every request. The message never holds the URL, whose password is a
    secret."""
    if value is None:
        return None
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 -- raises on a port that is not a number in range
    except ValueError as exc:
        raise ConfigError(f"{name} is not a valid URL: {exc}") from None
    if schemes and parts.scheme not in schemes:
        raise ConfigError(f"{name} must be a {', '.join(s + '://' for s in schemes)} URL")
    if host and not parts.hostname:
        raise ConfigError(f"{name} names no host")
    return value


def _jwks_url(value: str | None) -> str | None:
    """An ``https://`` URL, or plain ``http://`` to this machine only: the keys fetched there
    decide every identity, and anyone on the network path of a plain request could answer
    with keys of their own and sign tokens for any user of any tenant."""
    url = _url("TOOLGATE_JWKS_URL", value, ("https", "http"), host=True)
    if url is None:
        return None
    parts = urlsplit(url)
    if parts.scheme == "https" or loopback(parts.hostname):
        return url
    raise ConfigError(
        "TOOLGATE_JWKS_URL must be an https:// URL (plain http:// only to localhost or a "
        "loopback address): keys fetched in the clear can be swapped by anyone on the way"
    )


def _oidc(
    issuer: str | None, client_id: str | None, jwks_url: str | None
) -> tuple[str | None, str | None]:
    """The OIDC issuer and client id, both or neither. The issuer is an ``https://`` URL
    (plain ``http://`` only to this machine), written as the provider writes it in its
    tokens; its ID tokens are verified through ``TOOLGATE_JWKS_URL``, which must be set,
    with that issuer and the client id as their audience (unless set otherwise)."""
    if issuer is None and client_id is None:
        return None, None
    if issuer is None or client_id is None:
        raise ConfigError("set both TOOLGATE_OIDC_ISSUER and TOOLGATE_OIDC_CLIENT_ID, or neither")
    url = _url("TOOLGATE_OIDC_ISSUER", issuer, ("https", "http"), host=True)
    assert url is not None
    if not (url.isascii() and url.isprintable()) or " " in url:
        raise ConfigError("TOOLGATE_OIDC_ISSUER must be printable ASCII, without spaces")
    parts = urlsplit(url)
    if parts.query or parts.fragment or not (parts.scheme == "https" or loopback(parts.hostname)):
        raise ConfigError(
            "TOOLGATE_OIDC_ISSUER must be an https:// URL without query or fragment (plain"
            " http:// only to localhost or a loopback address)"
        )
    if jwks_url is None:
        raise ConfigError(
            "TOOLGATE_OIDC_ISSUER needs TOOLGATE_JWKS_URL, the issuer's key set: the console's"
            " tokens are verified like any other"
        )
    if not client_id.isascii() or not client_id.isprintable() or len(client_id) > 200:
        raise ConfigError("TOOLGATE_OIDC_CLIENT_ID must be printable ASCII, at most 200 characters")
    return url, client_id


def loopback(host: str | None) -> bool:
    """Whether ``host`` (a URL's host name) names this machine: ``localhost`` or a loopback
    address."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host or "").is_loopback
    except ValueError:
        return False


def _known_values_keys(current: str | None, previous: str | None) -> tuple[bytes, ...]:
    """The current key, then the previous one (kept only while a rotation lasts: the digests
    of sensitive values, whose plain form is never kept, cannot be made again under the new
    key until someone enters them again)."""
    if current is None:
        if previous is not None:
            raise ConfigError(
                "TOOLGATE_KNOWN_VALUES_PREVIOUS_KEY is set without TOOLGATE_KNOWN_VALUES_KEY"
            )
        return ()
    keys = tuple(key.encode() for key in (current, previous) if key is not None)
    if any(len(key) < MIN_KNOWN_VALUES_KEY_BYTES for key in keys):
        raise ConfigError(
            "TOOLGATE_KNOWN_VALUES_KEY (and TOOLGATE_KNOWN_VALUES_PREVIOUS_KEY) must be at least"
            f" {MIN_KNOWN_VALUES_KEY_BYTES} bytes: generate one with `openssl rand -hex 32`"
        )
    if len(set(keys)) != len(keys):
        raise ConfigError("TOOLGATE_KNOWN_VALUES_PREVIOUS_KEY is the current key")
    return keys


def _path(value: str | None) -> Path | None:
    return Path(value) if value else None
