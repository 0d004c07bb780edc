"""An MCP server that each person reaches as themselves: an OAuth 2.x resource server, for the tests of per-person
upstream credentials.

Streamable HTTP, at http://127.0.0.1:PORT/mcp:
    protected_upstream.py http PORT --authorization-server URL [--tokens alice:tokA,bob:tokB] [--seen PATH]
It serves only a bearer token issued for it, with scope `upstream`: a JWT access token (RFC 9068) signed with one of
the authorization server's keys (found through its metadata), for its own /mcp URL, from that issuer; or a static
personal token of --tokens. Otherwise it answers 401 with `WWW-Authenticate: Bearer ..., resource_metadata="..."`,
and its Protected Resource Metadata (RFC 9728, the SDK's) names the authorization server: the MCP authorization
spec's discovery. --seen PATH gets every Authorization header value it receives, one a line.

stdio: `protected_upstream.py stdio --tokens ...` knows its person from the token in UPSTREAM_TOKEN, as a stdio server
given a personal credential in its environment does; with --seen it writes `UPSTREAM_TOKEN=<value>` there at start.

`whoami` answers JSON {"person": ..., "audience": ..., "pid": "<id> <PID namespace>", "process": <random, this
process's own>} (audience: the JWT's `aud`, else null; the kernel reuses a gone namespace's number, so "process"
tells one sandboxed process from the next); with `quote`, over HTTP, also {"said": "your key is <the bearer
token>"}, as upstreams that echo a key do. So do, over HTTP, the resource key://mine and the prompt `key`.
Options may come from the environment instead: UPSTREAM_AUTHORIZATION_SERVER, UPSTREAM_TOKENS, UPSTREAM_SEEN.
"""

import argparse
import hmac
import json
import os
import sys
import uuid
from typing import Any

import anyio
import httpx2
import jwt
from mcp import types
from mcp.server import Server
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.server.auth.routes import create_protected_resource_routes
from mcp.server.auth.settings import AuthSettings
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

SCOPE = "upstream"
ALGORITHMS = ["RS256", "PS256", "ES256"]
ACCESS_TOKEN_TYPES = ("at+jwt", "application/at+jwt")  # RFC 9068 §4: a resource server checks `typ`

WHOAMI = types.Tool(
    name="whoami",
    description="The person the caller's credential names, the token's audience, and this server's process id.",
    input_schema={"type": "object", "properties": {"quote": {"type": "boolean"}}},
)
KEY = "key://mine"  # a resource, and a prompt `key`, that quote the caller's own token


PROCESS = uuid.uuid4().hex


def process() -> str:
    """This process: its id and its PID namespace (a sandboxed server's id is its namespace's, the same in each)."""
    return f"{os.getpid()} {os.readlink('/proc/self/ns/pid')}"


def parse_tokens(spec: str) -> dict[str, str]:
    """'alice:tokA,bob:tokB' -> {'alice': 'tokA', 'bob': 'tokB'}."""
    pairs = (item.split(":", 1) for item in spec.split(",") if item.strip())
    return {person.strip(): token.strip() for person, token in pairs}


def static_person(tokens: dict[str, str], token: str) -> str | None:
    """The person whose static token this is; every entry is compared, in constant time."""
    found = None
    for person, known in tokens.items():
        if hmac.compare_digest(known.encode(), token.encode()):
            found = person
    return found


def jwks_uri(issuer: str) -> str:
    """The key set's address from the authorization server's metadata: OpenID discovery, else RFC 8414 (an issuer
    without a path, as the tests' are)."""
    for suffix in ("/.well-known/openid-configuration", "/.well-known/oauth-authorization-server"):
        reply = httpx2.get(issuer.rstrip("/") + suffix, timeout=5)
        if reply.status_code == 200:
            metadata = reply.json()
            if metadata.get("issuer") != issuer:
                raise ValueError(f"the metadata at {issuer} names another issuer: {metadata.get('issuer')!r}")
            return str(metadata["jwks_uri"])
    raise ValueError(f"no authorization server metadata at {issuer}")


class UpstreamTokens:
    """The SDK's TokenVerifier: a static personal token, or a JWT access token of the authorization server."""

    def __init__(self, *, resource: str, issuer: str, tokens: dict[str, str]) -> None:
        self.resource, self.issuer, self.tokens = resource, issuer, tokens
        self._keys: jwt.PyJWKClient | None = None  # found at the first JWT: the server may start before its AS

    async def verify_token(self, token: str) -> AccessToken | None:
        person = static_person(self.tokens, token)
        if person is not None:
            return AccessToken(token=token, client_id="static", scopes=[SCOPE], resource=self.resource, subject=person)
        if token.count(".") != 2:
            return None
        try:
            claims = await anyio.to_thread.run_sync(self._decode, token)
        except (jwt.InvalidTokenError, jwt.PyJWKClientError, httpx2.HTTPError, ValueError, KeyError) as refused:
            print(f"refused a bearer token: {type(refused).__name__}: {refused}", file=sys.stderr, flush=True)
            return None
        return AccessToken(
            token=token,
            client_id=str(claims.get("client_id", "")),
            scopes=str(claims.get("scope", "")).split(),
            expires_at=int(claims["exp"]),
            resource=self.resource,  # PyJWT checked the audience
            subject=str(claims["sub"]),
            claims=claims,
        )

    def _decode(self, token: str) -> dict[str, Any]:
        if str(jwt.get_unverified_header(token).get("typ", "")).lower() not in ACCESS_TOKEN_TYPES:
            raise jwt.InvalidTokenError("not a JWT access token (typ at+jwt)")
        key = self._key_set().get_signing_key_from_jwt(token)
        return jwt.decode(
            token,
            key,
            algorithms=ALGORITHMS,
            audience=self.resource,
            issuer=self.issuer,
            options={"require": ["exp", "iat", "iss", "aud", "sub"]},
        )

    def _key_set(self) -> jwt.PyJWKClient:
        if self._keys is None:
            self._keys = jwt.PyJWKClient(jwks_uri(self.issuer), cache_keys=True, timeout=5)
        return self._keys


class SeenHeaders:
    """Appends every Authorization header value a request carries to a file, before anything checks it."""

    def __init__(self, app: ASGIApp, path: str) -> None:
        self.app, self.path = app, path

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            values = [value for name, value in scope["headers"] if name.lower() == b"authorization"]
            if values:
                with open(self.path, "ab") as seen:
                    seen.write(b"".join(value + b"\n" for value in values))
        await self.app(scope, receive, send)


def answer(value: dict[str, Any], is_error: bool = False) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=json.dumps(value))], is_error=is_error)


# Listed to, and served for, the person "admin" only: an account that sees more tools than another's.
REPORTS = types.Tool(name="reports", description="Admin only.", input_schema={"type": "object", "properties": {}})
ADMIN = "admin"


def _person(ctx) -> str:
    user = ctx.request.user  # set by the SDK's bearer middleware for this very request
    assert isinstance(user, AuthenticatedUser)
    return user.access_token.subject


async def list_tools(ctx, params) -> types.ListToolsResult:
    return types.ListToolsResult(tools=[WHOAMI, REPORTS] if _person(ctx) == ADMIN else [WHOAMI])


async def call_tool_http(ctx, params: types.CallToolRequestParams) -> types.CallToolResult:
    if params.name == REPORTS.name and _person(ctx) == ADMIN:
        return answer({"reports": []})
    if params.name != WHOAMI.name:
        return answer({"error": f"No tool {params.name} for {_person(ctx)}"}, True)
    user = ctx.request.user
    assert isinstance(user, AuthenticatedUser)
    audience = (user.access_token.claims or {}).get("aud")
    said = {"said": _quoted(ctx)} if (params.arguments or {}).get("quote") else {}
    return answer(
        {"person": user.access_token.subject, "audience": audience, "pid": process(), "process": PROCESS} | said
    )


def _quoted(ctx) -> str:
    user = ctx.request.user
    assert isinstance(user, AuthenticatedUser)
    return f"your key is {user.access_token.token}"


HOLD = types.Tool(
    name="hold",
    description="Answers once the file `until` exists (at most 30 s): a call that stays in flight while a test acts.",
    input_schema={"type": "object", "properties": {"until": {"type": "string"}}, "required": ["until"]},
)
HOLD_SECONDS = 30.0


async def stdio_list_tools(ctx, params) -> types.ListToolsResult:
    return types.ListToolsResult(tools=[WHOAMI, HOLD])


async def hold(until: str) -> types.CallToolResult:
    with anyio.move_on_after(HOLD_SECONDS):
        while not os.path.exists(until):
            await anyio.sleep(0.02)
    return answer({"released": os.path.exists(until), "pid": process()})


def stdio_call_tool(tokens: dict[str, str]):
    async def call_tool(ctx, params: types.CallToolRequestParams) -> types.CallToolResult:
        if params.name == HOLD.name:
            return await hold(str((params.arguments or {}).get("until", "")))
        if params.name != WHOAMI.name:
            raise ValueError(f"Unknown tool: {params.name}")
        person = static_person(tokens, os.environ.get("UPSTREAM_TOKEN", ""))
        if person is None:
            return answer({"error": "UPSTREAM_TOKEN names nobody this server knows", "pid": process()}, True)
        return answer({"person": person, "audience": None, "pid": process(), "process": PROCESS})

    return call_tool


NOTES = "notes://mine"  # a resource whose text names the person reading it


async def list_resources(ctx, params) -> types.ListResourcesResult:
    notes = types.Resource(uri=NOTES, name=f"notes of {_person(ctx)}")
    return types.ListResourcesResult(resources=[notes, types.Resource(uri=KEY, name="your key")])


async def read_resource(ctx, params: types.ReadResourceRequestParams) -> types.ReadResourceResult:
    text = _quoted(ctx) if str(params.uri) == KEY else f"the notes of {_person(ctx)}"
    return types.ReadResourceResult(contents=[types.TextResourceContents(uri=str(params.uri), text=text)])


KEY_PROMPT = types.Prompt(name="key", description="A prompt that quotes the caller's key.")


async def list_prompts(ctx, params) -> types.ListPromptsResult:
    return types.ListPromptsResult(prompts=[KEY_PROMPT])


async def get_prompt(ctx, params: types.GetPromptRequestParams) -> types.GetPromptResult:
    said = types.PromptMessage(role="user", content=types.TextContent(type="text", text=_quoted(ctx)))
    return types.GetPromptResult(messages=[said])


def http_app(port: int, issuer: str, tokens: dict[str, str], seen: str | None) -> ASGIApp:
    resource = f"http://127.0.0.1:{port}/mcp"
    server = Server(
        "protected-upstream",
        version="1.0",
        on_list_tools=list_tools,
        on_call_tool=call_tool_http,
        on_list_resources=list_resources,
        on_read_resource=read_resource,
        on_list_prompts=list_prompts,
        on_get_prompt=get_prompt,
    )
    auth = AuthSettings(
        issuer_url=issuer, resource_server_url=resource, required_scopes=[SCOPE], validate_token_resource=True
    )
    # The SDK serves the metadata at the resource's path only; RFC 9728 clients of an origin look at the root too.
    [metadata] = create_protected_resource_routes(resource, [issuer], scopes_supported=[SCOPE])
    root = Route("/.well-known/oauth-protected-resource", endpoint=metadata.endpoint, methods=["GET", "OPTIONS"])
    verifier = UpstreamTokens(resource=resource, issuer=issuer, tokens=tokens)
    app = server.streamable_http_app(auth=auth, token_verifier=verifier, custom_starlette_routes=[root])
    return SeenHeaders(app, seen) if seen else app


def serve_stdio(tokens: dict[str, str], seen: str | None) -> None:
    from mcp.server.stdio import stdio_server

    if seen:
        with open(seen, "a") as record:
            record.write(f"UPSTREAM_TOKEN={os.environ.get('UPSTREAM_TOKEN', '')}\n")
    calls = stdio_call_tool(tokens)
    server = Server("protected-upstream", version="1.0", on_list_tools=stdio_list_tools, on_call_tool=calls)

    async def serve() -> None:
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())

    try:
        anyio.run(serve)
    except* BrokenPipeError:  # the client went away: nothing left to say
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", choices=["http", "stdio"])
    parser.add_argument("port", nargs="?", type=int)
    parser.add_argument("--authorization-server", default=os.environ.get("UPSTREAM_AUTHORIZATION_SERVER"))
    parser.add_argument("--tokens", default=os.environ.get("UPSTREAM_TOKENS", ""), help="person:token,...")
    parser.add_argument("--seen", default=os.environ.get("UPSTREAM_SEEN"))
    args = parser.parse_args()
    tokens = parse_tokens(args.tokens)
    if args.mode == "stdio":
        serve_stdio(tokens, args.seen)
        return
    if args.port is None or not args.authorization_server:
        parser.error("http needs a PORT and --authorization-server")
    import uvicorn

    app = http_app(args.port, args.authorization_server, tokens, args.seen)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
