"""The session gateway: token-exact OpenAI-compatible sessions for external agent harnesses."""

from sandrl.inference.gateway.gateway import Gateway, create_gateway_app
from sandrl.inference.gateway.session import Session

__all__ = ["Gateway", "Session", "create_gateway_app"]
