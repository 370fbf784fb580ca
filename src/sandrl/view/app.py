"""The viewer's web app: the page, its script and style, and the JSON it reads, for one run.

The page runs only its own script (``Content-Security-Policy``: no inline script, no other origin),
sets every episode's text as text, and asks only this app. The app answers only requests whose
``Host`` is this loopback address (a web page elsewhere cannot rebind a name to 127.0.0.1 and read
the run), and serves nothing from the run directory but the reports the page lists, each in a
sandbox of its own.
"""

from __future__ import annotations

from importlib import resources
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import FileResponse, JSONResponse, PlainTextResponse, Response

from sandrl.view.run_view import EpisodeQuery, RunView

PAGE_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
REPORT_POLICY = "sandbox; default-src 'none'; img-src 'self' data:; style-src 'unsafe-inline'"
"""A linked report is the benchmarks' own HTML, still it runs in a sandbox: no script, no access to the viewer."""
ASSETS = {"viewer.js": "text/javascript", "viewer.css": "text/css"}
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]")


def asset(name: str) -> str:
    """One of the page's files (``viewer.html``, ``viewer.js``, ``viewer.css``)."""
    return resources.files("sandrl.view").joinpath("assets", name).read_text(encoding="utf-8")


def create_app(view: RunView) -> FastAPI:
    app = FastAPI(title="sandrl view", docs_url=None, redoc_url=None, openapi_url=None)

    @app.middleware("http")
    async def guard(request: Request, call_next: Any) -> Response:
        host = (request.headers.get("host") or "").rsplit(":", 1)[0] if request.headers.get("host") else ""
        if host not in LOOPBACK_HOSTS:
            return PlainTextResponse("sandrl view answers only on its loopback address", status_code=403)
        response: Response = await call_next(request)
        response.headers.setdefault("Content-Security-Policy", PAGE_POLICY)
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["Referrer-Policy"] = "no-referrer"
        response.headers["Cache-Control"] = "no-store"
        return response

    @app.get("/")
    def page() -> Response:
        return Response(asset("viewer.html"), media_type="text/html; charset=utf-8")

    @app.get("/assets/{name}")
    def assets(name: str) -> Response:
        if name not in ASSETS:
            raise HTTPException(404, "no such asset")
        return Response(asset(name), media_type=f"{ASSETS[name]}; charset=utf-8")

    @app.get("/api/summary")
    def summary() -> JSONResponse:
        return JSONResponse(view.summary())

    @app.get("/api/episodes")
    def episodes(query: Annotated[EpisodeQuery, Depends()]) -> JSONResponse:
        try:
            return JSONResponse(view.episodes(query))
        except ValueError as exc:
            return JSONResponse({"error": str(exc)}, status_code=400)

    @app.get("/api/episode/{number}")
    def episode(number: int) -> JSONResponse:
        try:
            return JSONResponse(view.episode(number))
        except KeyError:
            return JSONResponse({"error": f"no episode {number} in this run"}, status_code=404)
        except ValueError as exc:  # a line the index read but that is not a whole trajectory
            return JSONResponse({"error": f"episode {number} cannot be read: {exc}"}, status_code=422)

    @app.get("/reports/{name:path}")
    def report(name: str) -> Response:
        path = view.run.report_path(name)
        if path is None or not path.is_file():
            raise HTTPException(404, "no such report in this run")
        response = FileResponse(path)
        response.headers["Content-Security-Policy"] = REPORT_POLICY
        return response

    return app
