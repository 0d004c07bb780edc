"""What knowing the caller costs per request: `caller_from_scope` for an API key, for a JWT access token seen
before (the verified-token cache), and for one never seen (signature check included; the issuer's keys are
already fetched), interleaved request by request in one process. The issuer is served on 127.0.0.1 by this
script (its discovery document and JWKS), the tokens signed with its RSA key as an IdP would.

    bench/run identity --calls 2000
"""

import argparse
import asyncio
import json
import os
import statistics
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import jwt
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from run import setup_database  # noqa: E402  (bench/run.py: the same data and environment)

KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
RESOURCE = "http://127.0.0.1:8000/mcp"


def serve_issuer() -> str:
    """An issuer's two documents on a free port; returns the issuer URL."""
    public = json.loads(RSAAlgorithm.to_jwk(KEY.public_key())) | {"kid": "bench-1", "use": "sig", "alg": "RS256"}
    documents: dict[str, bytes] = {"/jwks": json.dumps({"keys": [public]}).encode()}

    class Issuer(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = documents.get(self.path)
            self.send_response(200 if body else 404)
            self.send_header("content-type", "application/json")
            self.end_headers()
            self.wfile.write(body or b"{}")

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Issuer)
    issuer = f"http://127.0.0.1:{server.server_port}"
    discovery = {"issuer": issuer, "jwks_uri": f"{issuer}/jwks"}
    documents["/.well-known/openid-configuration"] = json.dumps(discovery).encode()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return issuer


def token(issuer: str, subject: str) -> str:
    now = int(time.time())
    claims = {"iss": issuer, "aud": RESOURCE, "sub": subject, "iat": now, "exp": now + 3600, "client_id": "bench"}
    return jwt.encode(claims, KEY, algorithm="RS256", headers={"kid": "bench-1"})


def scope(credential: str) -> dict:
    headers = [(b"host", b"127.0.0.1:8000"), (b"authorization", f"Bearer {credential}".encode())]
    return {"type": "http", "scheme": "http", "headers": headers, "query_string": b""}


async def measure(key: str, issuer: str, calls: int) -> dict[str, list[float]]:
    from handoff.mcp.caller import caller_from_scope

    seen = token(issuer, "seen-before")
    fresh = [token(issuer, f"person-{n}") for n in range(calls + 20)]
    cases = {
        "API key": lambda n: scope(key),
        "JWT, verified before": lambda n: scope(seen),
        "JWT, first sight": lambda n: scope(fresh[n]),
    }
    times: dict[str, list[float]] = {name: [] for name in cases}
    for n in range(20):  # warm: the snapshot, the issuer's keys
        for make in cases.values():
            await caller_from_scope(make(n), "http")
    for n in range(20, calls + 20):
        for name, make in cases.items():
            request = make(n)
            started = time.perf_counter()
            await caller_from_scope(request, "http")
            times[name].append((time.perf_counter() - started) * 1000)
    return times


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    issuer = serve_issuer()
    os.environ |= {"GATEWAY_OIDC_ISSUER": issuer, "GATEWAY_OIDC_AGENT": "bench"}
    key = setup_database()
    times = asyncio.run(measure(key, issuer, args.calls))
    print("| credential | p50 ms | p90 ms | p50 against the API key |")
    print("|---|---:|---:|---:|")
    base = statistics.median(times["API key"])
    for name, values in times.items():
        median = statistics.median(values)
        print(f"| {name} | {median:.3f} | {statistics.quantiles(values, n=10)[8]:.3f} | {median / base:.1f}× |")


if __name__ == "__main__":
    main()
