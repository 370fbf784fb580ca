"""A token service as Docker Hub's and ghcr.io's: it answers ``GET /token?service=&scope=`` with a
JWT the registry trusts (RS256, the signing certificate in its ``x5c`` header), and checks basic
auth when it has users. Keys and signatures are made by the ``openssl`` command, so the tests need
no crypto library; the registry that verifies the tokens is the real one."""

from __future__ import annotations

import base64
import json
import secrets
import subprocess
import time
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from sandrl.background_server import BackgroundServer

ISSUER = "sandrl-test-issuer"
SERVICE = "sandrl-test-registry"


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class TokenServer:
    def __init__(self, root: Path, users: dict[str, str]) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.key, self.cert = root / "token.key", root / "token.pem"
        subprocess.run(
            [
                "openssl",
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-keyout",
                str(self.key),
                "-out",
                str(self.cert),
                "-days",
                "2",
                "-subj",
                "/CN=sandrl-test-token",
            ],
            check=True,
            capture_output=True,
        )
        der = subprocess.run(
            ["openssl", "x509", "-in", str(self.cert), "-outform", "DER"], check=True, capture_output=True
        ).stdout
        self._x5c = base64.b64encode(der).decode()
        self.users = users
        self.requests: list[dict[str, str]] = []
        app = FastAPI()
        app.add_api_route("/token", self._token, methods=["GET"])
        self.server = BackgroundServer(app)

    def start(self) -> TokenServer:
        self.server.start()
        return self

    def stop(self) -> None:
        self.server.stop()

    @property
    def realm(self) -> str:
        return f"{self.server.url}/token"

    def registry_config(self) -> dict[str, str]:
        return {"realm": self.realm, "service": SERVICE, "issuer": ISSUER, "rootcertbundle": str(self.cert)}

    async def _token(self, request: Request) -> Response:
        params = dict(request.query_params)
        header = request.headers.get("authorization", "")
        self.requests.append({**params, "authorization": header})
        subject = ""
        if header.lower().startswith("basic "):
            user, _, password = base64.b64decode(header[6:]).decode().partition(":")
            if self.users.get(user) != password:
                return JSONResponse({"details": "bad credentials"}, status_code=401)
            subject = user
        elif self.users:
            return JSONResponse({"details": "credentials required"}, status_code=401)
        access = []
        for scope in request.query_params.getlist("scope"):
            kind, _, rest = scope.partition(":")
            name, _, actions = rest.rpartition(":")
            access.append({"type": kind, "name": name, "actions": actions.split(",")})
        now = int(time.time())
        claims = {
            "iss": ISSUER,
            "sub": subject,
            "aud": params.get("service", ""),
            "exp": now + 300,
            "nbf": now - 10,
            "iat": now,
            "jti": secrets.token_hex(8),
            "access": access,
        }
        head = {"typ": "JWT", "alg": "RS256", "x5c": [self._x5c]}
        signing_input = f"{_b64url(json.dumps(head).encode())}.{_b64url(json.dumps(claims).encode())}"
        signature = subprocess.run(
            ["openssl", "dgst", "-sha256", "-sign", str(self.key)],
            input=signing_input.encode(),
            check=True,
            capture_output=True,
        ).stdout
        token = f"{signing_input}.{_b64url(signature)}"
        return JSONResponse({"token": token, "access_token": token, "expires_in": 300})
