"""The session gateway: token-exact OpenAI-compatible sessions for external agent harnesses."""

# Each vendor's routes register on the session's router (``harness_router``) when imported: here, so that
# every app that serves it (the runner's gateway, ``sandrl serve inference``) serves them too.
from sandrl.inference.gateway import anthropic_routes as anthropic_routes
from sandrl.inference.gateway import responses as responses
from sandrl.inference.gateway.gateway import Gateway, create_gateway_app
from sandrl.inference.gateway.session import Session

__all__ = ["Gateway", "Session", "create_gateway_app"]
