"""A client for toolgate, the authorization service for agent tool calls: ``Client`` for
blocking code, ``AsyncClient`` for asyncio, the same operations on both."""

from toolgate_client._core import Retry, new_idempotency_key
from toolgate_client.aio import AsyncClient
from toolgate_client.errors import ToolgateError
from toolgate_client.models import Execution
from toolgate_client.sync import Client

__all__ = ["AsyncClient", "Client", "Execution", "Retry", "ToolgateError", "new_idempotency_key"]
