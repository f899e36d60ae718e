"""A real OpenID provider for the console's sign-in tests: ``oidc-provider-mock`` (a Flask
app on authlib) in a process of its own, with what a provider a browser signs in to must
also do and that package does not:

* **PKCE**: an authorization request's ``code_challenge`` (S256 only) is kept with the code
  it issues, and the token endpoint redeems the code only with the matching
  ``code_verifier`` (``invalid_grant`` otherwise, as RFC 7636 says);
* **CORS** on the token endpoint for the console's origin, so a page can redeem its code.

Clients must be registered (exact redirect URIs) and must send a nonce; a public client
(no secret) may redeem its codes, as a console in a browser must. Run it as
``python -m tests.oidc_provider --port P --origin http://127.0.0.1:Q [--token-max-age S]``;
it prints ``ready`` once it listens.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import sys
import threading
from collections.abc import Callable, Iterable
from datetime import timedelta
from typing import Any
from urllib.parse import parse_qs, urlsplit

import oidc_provider_mock
import werkzeug.serving
from oidc_provider_mock import _app

Environ = dict[str, Any]
StartResponse = Callable[..., Any]
WSGIApp = Callable[[Environ, StartResponse], Iterable[bytes]]


class Strict:
    """The provider's WSGI app with PKCE enforced and CORS for one origin."""

    def __init__(self, app: WSGIApp, origin: str) -> None:
        self.app, self.origin = app, origin
        self.challenges: dict[str, str] = {}
        self.lock = threading.Lock()

    def __call__(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        path, method = environ.get("PATH_INFO", ""), environ["REQUEST_METHOD"]
        if path == "/oauth2/token":
            return self._token(environ, start_response, method)
        if path == "/oauth2/authorize" and method == "POST":
            return self._authorize(environ, start_response)
        return self.app(environ, start_response)

    def _authorize(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        query = parse_qs(environ.get("QUERY_STRING", ""))
        challenge = query.get("code_challenge", [""])[0]
        s256 = query.get("code_challenge_method", [""])[0] == "S256"

        def noting(status: str, headers: list[tuple[str, str]], *rest: Any) -> Any:
            location = dict(headers).get("Location", "")
            code = parse_qs(urlsplit(location).query).get("code", [""])[0]
            if code and challenge and s256:
                with self.lock:
                    self.challenges[code] = challenge
            return start_response(status, headers, *rest)

        return self.app(environ, noting)

    def _token(
        self, environ: Environ, start_response: StartResponse, method: str
    ) -> Iterable[bytes]:
        cors = [("Access-Control-Allow-Origin", self.origin), ("Vary", "Origin")]
        if method == "OPTIONS":
            start_response(
                "204 No Content",
                [
                    *cors,
                    ("Access-Control-Allow-Methods", "POST"),
                    ("Access-Control-Allow-Headers", "content-type"),
                ],
            )
            return [b""]
        size = int(environ.get("CONTENT_LENGTH") or 0)
        body = environ["wsgi.input"].read(size)
        form = parse_qs(body.decode())
        code, verifier = form.get("code", [""])[0], form.get("code_verifier", [""])[0]
        with self.lock:
            challenge = self.challenges.pop(code, None)
        digest = hashlib.sha256(verifier.encode()).digest()
        if challenge is None or base64.urlsafe_b64encode(digest).rstrip(b"=").decode() != challenge:
            start_response("400 Bad Request", [*cors, ("Content-Type", "application/json")])
            return [b'{"error": "invalid_grant", "error_description": "PKCE"}']
        environ["wsgi.input"] = _Replay(body)

        def with_cors(status: str, headers: list[tuple[str, str]], *rest: Any) -> Any:
            return start_response(status, [*headers, *cors], *rest)

        return self.app(environ, with_cors)


class _Replay:
    def __init__(self, body: bytes) -> None:
        self.body = body

    def read(self, size: int = -1) -> bytes:
        taken, self.body = (self.body, b"") if size < 0 else (self.body[:size], self.body[size:])
        return taken


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--origin", required=True, help="the console's origin (CORS)")
    parser.add_argument("--token-max-age", type=float, default=3600.0)
    ns = parser.parse_args()
    # The package's token endpoint admits only confidential clients; a console in a browser
    # is a public client (RFC 6749, 2.1), which is what PKCE protects: admit "none" here.
    _app.AuthorizationCodeGrant.TOKEN_ENDPOINT_AUTH_METHODS = [
        "client_secret_basic",
        "client_secret_post",
        "none",
    ]
    app = oidc_provider_mock.app(
        require_client_registration=True,
        require_nonce=True,
        issue_refresh_token=False,
        access_token_max_age=timedelta(seconds=ns.token_max_age),
    )
    server = werkzeug.serving.make_server(
        "127.0.0.1", ns.port, Strict(app, ns.origin), threaded=True
    )
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    server.serve_forever()


if __name__ == "__main__":
    main()
