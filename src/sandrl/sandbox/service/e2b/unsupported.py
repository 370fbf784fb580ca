"""The E2B routes sandrl does not serve yet: each answers 400 ``not_supported`` saying so.

A request this server cannot honour is refused as an unenforceable limit is (see
:class:`~sandrl.errors.LimitUnsupportedError`), never as a server fault. This router is mounted
after every other E2B router, so its catch-all trees (``/templates/...``) only take what no
served route (``DELETE /templates/{snapshot}``, ``GET /snapshots``) took first. The routes are
left out of the OpenAPI document (E2B's own spec has them): here they only ever refuse.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from sandrl.sandbox.service.e2b.control import not_supported

router = APIRouter(tags=["e2b"])

_UNSUPPORTED: list[tuple[str, list[str], str, str]] = [
    ("/sandboxes/{sandbox_id}/snapshots", ["GET"], "this listing route", "GET /snapshots?sandboxID=<id> lists them"),
    ("/sandboxes/{sandbox_id}/network", ["PUT"], "changing a sandbox's network rules", ""),
    ("/sandboxes/{sandbox_id}/logs", ["GET"], "sandbox logs", ""),
    ("/v2/sandboxes/{sandbox_id}/logs", ["GET"], "sandbox logs", ""),
]
_TEMPLATE_HINT = "build a sandrl image with `sandrl images build` and pass its name as the template"
_UNSUPPORTED_TREES = [
    ("/templates", "templates built through the SDK", _TEMPLATE_HINT),
    ("/v2/templates", "templates built through the SDK", _TEMPLATE_HINT),
    ("/v3/templates", "templates built through the SDK", _TEMPLATE_HINT),
    ("/snapshots", "this snapshot route", "GET /snapshots lists them, DELETE /templates/{id} deletes one"),
    ("/volumes", "volumes", ""),
]
_ALL_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE"]


def _refuse(what: str, hint: str) -> Any:
    async def refuse() -> None:
        raise not_supported(what, hint)

    refuse.__doc__ = f"Not supported yet: {what} (400 not_supported)."
    return refuse


for _path, _methods, _what, _hint in _UNSUPPORTED:
    router.add_api_route(_path, _refuse(_what, _hint), methods=_methods, include_in_schema=False)
for _root, _what, _hint in _UNSUPPORTED_TREES:
    for _path in (_root, _root + "/{rest:path}"):
        router.add_api_route(_path, _refuse(_what, _hint), methods=_ALL_METHODS, include_in_schema=False)
