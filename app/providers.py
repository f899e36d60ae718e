"""The provider client: owner lookups and forwarded calls to catalog providers.

URLs come only from the catalog: the provider's ``base_url`` plus the endpoint path, with
placeholders filled from percent-encoded arguments, each inside its own segment (``policy``
refuses values like ``..`` that no encoding confines). The URL is sent exactly as built, so
the path the provider receives has the shape the catalog declares. Identity headers come
from the verified principal. Transport failures are mapped to the API's provider errors by the
caller, who knows whether an uncertain outcome matters.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple
from urllib.parse import quote

from app.auth.principal import Principal
from app.catalog.models import Endpoint, Owner, Provider, Resource, argument_text
from app.errors import ProviderUnavailable
from app.outbound import NotSent, Outbound, Response, TooLarge, Uncertain
from app.telemetry import ProviderCall, owner_lookup, tool_call


class ProviderRequest(NamedTuple):
    method: str
    url: str
    params: dict[str, str] | None
    json: dict[str, Any] | None


def build_request(
    provider: Provider, endpoint: Endpoint, arguments: Mapping[str, Any]
) -> ProviderRequest:
    path = endpoint.path
    for name in endpoint.placeholders:
        path = path.replace("{" + name + "}", quote(argument_text(arguments[name]), safe=""))
    rest = {k: v for k, v in arguments.items() if k not in endpoint.placeholders}
    if endpoint.method in ("GET", "DELETE"):
        params = {k: argument_text(v) for k, v in rest.items()}
        return ProviderRequest(endpoint.method, provider.base_url + path, params or None, None)
    return ProviderRequest(endpoint.method, provider.base_url + path, None, rest)


class ProviderClient:
    """Every request toolgate makes to a catalog provider goes through here, inside its
    provider span (``app.telemetry``)."""

    def __init__(self, outbound: Outbound) -> None:
        self._outbound = outbound

    async def owner(self, resource: Resource, resource_id: str) -> Owner | None:
        """The resource's owner, or ``None`` when the provider does not know it.

        Anything but a clear answer is an outage (502), never an allow.
        """
        request = build_request(resource.provider, resource.owner, {"id": resource_id})
        try:
            span = owner_lookup(resource.provider, resource.owner, resource.type)
            response = await self._send(resource.provider, request, {}, span)
        except TooLarge as exc:
            raise ProviderUnavailable("the resource owner lookup's response is too large") from exc
        except (NotSent, Uncertain) as exc:
            raise ProviderUnavailable("the resource owner could not be looked up") from exc
        body = response.body
        if (
            response.status == 200
            and isinstance(body, dict)
            and isinstance(body.get("tenant"), str)
        ):
            user = body.get("user")
            return Owner(body["tenant"], user if isinstance(user, str) else None)
        if 400 <= response.status < 500:
            return None
        raise ProviderUnavailable("the resource owner could not be looked up")

    async def call(
        self,
        provider: Provider,
        endpoint: Endpoint,
        arguments: Mapping[str, Any],
        principal: Principal,
        call_id: str,
        operation_id: str | None = None,
    ) -> Response:
        """Forward one call; raises ``NotSent`` / ``Uncertain`` from the transport. A call with
        an ``operation_id`` is a mutation's execution: it is written at most once (the
        outbound ``once``), so that ``NotSent`` is certain and anything after the request
        may have left is ``Uncertain``, whatever the method."""
        headers = {
            "X-Toolgate-Actor": principal.sub,
            "X-Toolgate-Tenant": principal.tenant,
            "X-Toolgate-Call-Id": call_id,
        }
        if operation_id is not None:
            headers["Idempotency-Key"] = operation_id
        request = build_request(provider, endpoint, arguments)
        span = tool_call(provider, endpoint, call_id, operation_id)
        return await self._send(provider, request, headers, span, once=operation_id is not None)

    async def _send(
        self,
        provider: Provider,
        request: ProviderRequest,
        headers: dict[str, str],
        span: ProviderCall,
        *,
        once: bool = False,
    ) -> Response:
        """Send inside the provider span, whose context is the ``traceparent`` sent."""
        all_headers = {**provider.headers, **headers}
        with span:
            span.inject(all_headers)
            response = await self._outbound.request(
                request.method,
                request.url,
                timeout_s=provider.timeout_s,
                headers=all_headers,
                json=request.json,
                params=request.params,
                max_bytes=provider.max_response_bytes,
                once=once,
            )
            span.answered(response.status)
        return response
