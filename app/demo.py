"""``toolgate demo``: everything a trial needs, in one process.

Why one process: a newcomer runs one command and stops it with Ctrl-C, and nothing is left
behind. The demo providers (``examples/demo_providers.py``) answer in a thread of this
process; toolgate serves the packaged demo catalog with one worker and its sealer; the
store is the embedded one (unless ``TOOLGATE_DATABASE_URL`` is set), which ``toolgate``
stops on the way out like any owner. The JWT secret is ``TOOLGATE_JWT_SECRET`` when set,
else the fixed, published ``DEMO_SECRET``: only the demo ever falls back to it (``serve``
refuses to start without a key), and ``toolgate token`` mints with it when no key at all
is configured, so tokens minted beside a demo are accepted by it. With that secret the
demo listens on loopback only (``check_reach``). Known values are digested under
``TOOLGATE_KNOWN_VALUES_KEY`` when set, else under the published ``DEMO_KNOWN_VALUES_KEY``
(``serve`` without one runs with known values off, and warns).
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from pathlib import Path
from urllib.parse import urlsplit

from app.auth.tokens import mint
from app.settings import ConfigError, Settings, loopback

DEMO_SECRET = "demo-only-secret-change-me-0123456789abcdef"
DEMO_KNOWN_VALUES_KEY = "demo-only-known-values-key-change-me-0123456789"
CATALOG = Path(__file__).resolve().parent / "catalog" / "demo.yaml"
PROVIDERS_URL = "http://127.0.0.1:9100"
TOKEN_TTL_S = 12 * 3600
USERS = (  # (variable, sub, tenant, roles): the demo providers' users, and an auditor
    ("ALICE", "alice", "acme", "support"),
    ("BOB", "bob", "acme", "finance_approver"),
    ("DAVE", "dave", "acme", "customer"),
    ("CAROL", "carol", "globex", "customer"),
    ("ERIN", "erin", "acme", "auditor"),
)


def prepare(env: MutableMapping[str, str]) -> tuple[str, int]:
    """Set the demo's defaults in ``env`` (the catalog always, the secret, the known values'
    key and the providers' URL unless given); the providers' host and port. ``DEMO_SECRET``
    is an HS256 key, as ``toolgate token`` signs with it: too short for HS384/HS512, and no
    key for others."""
    env["TOOLGATE_CATALOG"] = str(CATALOG)
    if not env.get("TOOLGATE_KNOWN_VALUES_KEY", "").strip():
        env["TOOLGATE_KNOWN_VALUES_KEY"] = DEMO_KNOWN_VALUES_KEY
    if not env.get("TOOLGATE_JWT_SECRET", "").strip():
        env["TOOLGATE_JWT_SECRET"] = DEMO_SECRET
        env["TOOLGATE_JWT_ALGORITHMS"] = "HS256"
    url = env.setdefault("DEMO_PROVIDERS_URL", PROVIDERS_URL)
    try:
        parts = urlsplit(url)
        return parts.hostname or "127.0.0.1", parts.port or 80
    except ValueError as exc:  # a port that is no number or out of range, an unclosed [
        raise ConfigError(f"DEMO_PROVIDERS_URL {url!r} is not a URL to listen on: {exc}") from None


def check_reach(host: str, env: Mapping[str, str]) -> None:
    """Refuse the published ``DEMO_SECRET`` on an address other than loopback: whoever
    reaches the port could mint a token for any user, tenant and role, admin included, and
    read or act on whatever the store holds (``TOOLGATE_DATABASE_URL`` may name a real one)."""
    if env.get("TOOLGATE_JWT_SECRET", "").strip() != DEMO_SECRET:
        return
    if not loopback(host):
        raise ConfigError(
            f"toolgate demo would listen on {host} with the published demo secret, and anyone"
            " who reaches it could sign a token for any user, tenant and role: set"
            " TOOLGATE_JWT_SECRET to a secret of your own, or listen on 127.0.0.1"
        )


def banner(settings: Settings, base_url: str, env: Mapping[str, str]) -> str:
    """What to paste into a second shell: the tokens and a first call."""
    secret = settings.jwt_secret
    lines = [
        "",
        f"toolgate demo: {base_url}  (providers: {env['DEMO_PROVIDERS_URL']})",
        "JWT secret: "
        + (f"{secret} (the fixed demo secret)" if secret == DEMO_SECRET else "TOOLGATE_JWT_SECRET"),
        "Tokens (valid 12 h) for a second shell:",
    ]
    for variable, sub, tenant, roles in USERS:
        token = mint(settings, sub, tenant, [roles], TOKEN_TTL_S)
        lines.append(f"  export {variable}={token}  # {sub}: {roles} in {tenant}")
    lines += [
        "Try:",
        f'  curl -s {base_url}/propose -H "authorization: Bearer $ALICE" '
        "-H 'content-type: application/json' \\",
        '    -d \'{"tool":"get_order","arguments":{"order_id":"ord_1"}}\'',
        "Ctrl-C stops everything.",
        "",
    ]
    return "\n".join(lines)
