"""The tests' external identity provider: npm's oidc-provider (tests/support/oidc_provider.mjs) signing with a key
the test made, so that tests can both get real tokens from it and forge the bad ones; and a gateway that trusts it."""

import base64
import hashlib
import json
import re
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, urlencode, urljoin, urlsplit

import httpx2
import jwt
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm

from tests import servers
from tests.clients import INITIALIZE

REDIRECT = "http://127.0.0.1:9/callback"  # never opened: the code is read off the redirect
CLIENTS = [
    {"client_id": "robot", "client_secret": "robot-secret", "grant_types": ["client_credentials"]}
    | {"redirect_uris": [], "response_types": []},
    {"client_id": "desk", "token_endpoint_auth_method": "none", "grant_types": ["authorization_code"]}
    | {"redirect_uris": [REDIRECT], "response_types": ["code"]},
]
ACCEPT = {"Accept": "application/json, text/event-stream"}
CONSOLE_SECRET = "console-secret-for-tests-only"


def private_jwk(kid: str) -> tuple[rsa.RSAPrivateKey, dict]:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return key, json.loads(RSAAlgorithm.to_jwk(key)) | {"kid": kid, "use": "sig", "alg": "RS256"}


@dataclass
class Idp:
    issuer: str
    resource: str
    key: rsa.RSAPrivateKey  # the provider's signing key, kid idp-1
    groups: Path | None = None  # the provider's OIDC_GROUPS_FILE

    def give_groups(self, login: str, groups: list[str]) -> None:
        """From the next sign-in on, `login` is in `groups` at the IdP (and only those)."""
        given = json.loads(self.groups.read_text()) | {login: groups}
        self.groups.write_text(json.dumps(given))

    def forge(self, key=None, kid: str | None = "idp-1", algorithm: str = "RS256", **claims) -> str:
        """A token as the provider would sign it, with any claim changed (None removes it)."""
        now = int(time.time())
        body = {"iss": self.issuer, "aud": self.resource, "sub": "forged", "iat": now, "exp": now + 300}
        body |= {"scope": "mcp", "client_id": "desk"}
        body = {name: value for name, value in (body | claims).items() if value is not None}
        headers = {"kid": kid} if kid else {}
        signer = None if algorithm == "none" else key or self.key
        return jwt.encode(body, signer, algorithm=algorithm, headers=headers)

    def robot_token(self) -> str:
        grant = {"grant_type": "client_credentials", "scope": "mcp", "resource": self.resource}
        reply = httpx2.post(f"{self.issuer}/token", data=grant, auth=("robot", "robot-secret"), timeout=10)
        return reply.json()["access_token"]

    def person_token(self, login: str) -> str:
        """A person signs in through the provider's pages (login, then consent) with PKCE, as a browser would."""
        verifier = secrets.token_urlsafe(48)
        challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
        query = {"client_id": "desk", "response_type": "code", "redirect_uri": REDIRECT, "state": "s"}
        query |= {"scope": "openid mcp", "resource": self.resource}
        query |= {"code_challenge": challenge, "code_challenge_method": "S256"}
        with httpx2.Client(base_url=self.issuer, timeout=10) as http:
            page = http.get(f"/auth?{urlencode(query)}")
            for _step in range(10):
                if page.status_code in (302, 303):
                    location = page.headers["location"]
                    if location.startswith(REDIRECT):
                        break
                    page = http.get(urljoin(self.issuer, location))
                    continue
                form = dict(re.findall(r'name="([^"]+)"(?: [^>]*)? value="([^"]*)"', page.text))
                if 'name="login"' in page.text:
                    form |= {"login": login, "password": "any"}
                action = re.search(r'action="([^"]+)"', page.text).group(1)
                page = http.post(urljoin(self.issuer, action), data=form)
            code = parse_qs(urlsplit(page.headers["location"]).query)["code"][0]
            exchange = {"grant_type": "authorization_code", "code": code, "redirect_uri": REDIRECT}
            exchange |= {"client_id": "desk", "code_verifier": verifier, "resource": self.resource}
            return http.post("/token", data=exchange).json()["access_token"]


def post_initialize(gateway: servers.Running, token: str, url_suffix: str = "") -> httpx2.Response:
    headers = ACCEPT | {"Authorization": f"Bearer {token}"}
    return httpx2.post(f"{gateway.url}/mcp{url_suffix}", json=INITIALIZE, headers=headers, timeout=10)
