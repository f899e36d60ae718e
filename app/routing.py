"""``DecisionRoute``: FastAPI's route class for the decision endpoints, with a lean call path.

``/propose``, ``/dry-run``, ``/execute`` and ``/approve`` are ordinary FastAPI routes: the
app's router matches them, every middleware and exception handler of the app sees them, and
OpenAPI describes them from their signatures. What differs is how a ``DecisionRoute`` calls
its endpoint. FastAPI's handler solves the dependency graph on every request and opens two
exit stacks around it, which cost every read measurable CPU for features these endpoints
do not use. A ``DecisionRoute`` binds the same signature once, when the route is built, into
a list of steps, and serves a request by running them in order:

- a dependency (``Annotated[T, Depends(f)]``) whose only parameter is the ``Request``:
  ``await f(request)``, as for ``app.deps.authenticate`` and ``get_state``;
- a header parameter (``Annotated[str | None, Header(alias=...)]``): the header's value;
- one body parameter, an ``app.bodies.Body``: ``app.deps.read_body`` (pydantic-core straight
  from the bytes, the content type checked as FastAPI's strict mode does).

Anything else in the signature (query or path parameters, nested dependencies, a body of
another kind) is refused when the route is built, so the fast path never drops something
FastAPI would have done. The endpoint returns its ``Response`` itself; ``response_model``
documents it. A ``DecisionRoute`` is served as Starlette serves a route (``self.app``): it
sees no prefix or dependencies of a router that includes it, so ``app.main`` puts the
decision routes straight into the app's own router.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute
from starlette import routing
from starlette.types import Receive, Scope, Send

from app import load
from app.bodies import Body
from app.deps import read_body

Step = Callable[[Request], Awaitable[Any]]
Handler = Callable[[Request], Coroutine[Any, Any, Response]]


def operation_id(route: APIRoute) -> str:
    """An OpenAPI operation is named after its endpoint function (``propose``, ``read_run``)."""
    return route.name


class DecisionRoute(APIRoute):
    def __init__(self, path: str, endpoint: Callable[..., Any], **kwargs: Any) -> None:
        super().__init__(path, endpoint, **kwargs)
        handler = self.get_route_handler()

        async def app(scope: Scope, receive: Receive, send: Send) -> None:
            with load.deciding:
                response = await handler(Request(scope, receive, send))
                await response(scope, receive, send)

        self.app = app

    def get_route_handler(self) -> Handler:
        return bind(self.dependant)

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        """As Starlette's ``Route``: a 405 for another method, else ``self.app``."""
        await routing.Route.handle(self, scope, receive, send)


def bind(dependant: Dependant) -> Handler:
    """The endpoint of ``dependant`` as ``handler(request)``, its arguments made by steps
    decided here, once; ``TypeError`` for a parameter no step can make."""
    if dependant.query_params or dependant.path_params or dependant.cookie_params:
        raise TypeError(f"{dependant.call}: a decision route takes no query or path parameters")
    steps: list[tuple[str | None, Step]] = [
        (dependency.name, _request_only(dependency)) for dependency in dependant.dependencies
    ]
    for field in dependant.header_params:
        steps.append((field.name, _header(field.alias)))
    for field in dependant.body_params:
        model = field.field_info.annotation
        if not (isinstance(model, type) and issubclass(model, Body)):
            raise TypeError(f"{dependant.call}: a decision route's body must be an app.bodies.Body")
        steps.append((field.name, _body(model)))
    endpoint = dependant.call
    assert endpoint is not None

    async def handler(request: Request) -> Response:
        arguments = {}
        for name, step in steps:
            value = await step(request)
            if name is not None:
                arguments[name] = value
        response: Response = await endpoint(**arguments)
        return response

    return handler


def _request_only(dependency: Dependant) -> Step:
    call = dependency.call
    if (
        call is None
        or dependency.request_param_name is None
        or dependency.dependencies
        or dependency.query_params
        or dependency.path_params
        or dependency.header_params
        or dependency.cookie_params
        or dependency.body_params
    ):
        raise TypeError(f"{call}: a decision route's dependency takes only the request")
    return call


def _header(name: str) -> Step:
    """The header's value; several lines of it are one comma-separated value (RFC 9110
    §5.3), as a proxy that joins them would pass it on: never just the first line."""

    async def header(request: Request) -> str | None:
        values = request.headers.getlist(name)
        return ", ".join(values) if values else None

    return header


def _body(model: type[Body]) -> Step:
    async def body(request: Request) -> Body:
        return await read_body(request, model)

    return body
