"""A small REST service shipped with Switchboard: a `rest` upstream for the docs' worked example and the tests.

    python examples/rest_service.py PORT      # 127.0.0.1 only; its OpenAPI document at /openapi.json

It serves a little inventory (`/items`), and on purpose what a REST upstream must survive: an error that
repeats the caller's credential, a slow answer, redirects (one to a private address), an answer larger than
the gateway takes, XML as an OData service answers, a path that echoes how it arrived (escaping), and hostile
OpenAPI documents under `/hostile/` (a broken `$ref`, a cycle, an external `$ref` and a `servers` URL at
private addresses, a YAML anchor bomb, a 50 MB document). REST_SERVICE_TOKEN set: every request but the
document's must carry `Authorization: Bearer <it>`; `name:token,name:token` gives each caller a token of their
own, and `/me` says whose came. REST_SERVICE_NOTE names a file whose text, when it exists, is getItem's
description: a document that changes.
"""

import json
import os
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

ITEM = {"type": "object", "properties": {"id": {"type": "string"}, "name": {"type": "string"}}}
BIG_BYTES = 3 * 1024 * 1024
HUGE_BYTES = 50 * 1024 * 1024


def _param(name: str, where: str, schema: dict[str, Any], required: bool = False) -> dict[str, Any]:
    return {"name": name, "in": where, "required": required or where == "path", "schema": schema}


def _json_answer(schema: dict[str, Any]) -> dict[str, Any]:
    return {"200": {"description": "ok", "content": {"application/json": {"schema": schema}}}}


def _operation(operation_id: str, summary: str, *parameters: dict[str, Any], **rest: Any) -> dict[str, Any]:
    return {"operationId": operation_id, "summary": summary, "parameters": list(parameters)} | rest


def document(port: int) -> dict[str, Any]:
    string = {"type": "string"}
    note = Path(os.environ.get("REST_SERVICE_NOTE") or os.devnull)
    described = {"description": note.read_text()} if note.is_file() else {}
    return {
        "openapi": "3.1.0",
        "info": {"title": "Inventory", "version": "1.0"},
        "servers": [{"url": "/"}],
        "paths": {
            "/items": {
                "get": _operation(
                    "listItems",
                    "List the items.",
                    _param("limit", "query", {"type": "integer"}),
                    tags=["items"],
                    responses=_json_answer({"type": "array", "items": {"$ref": "#/components/schemas/Item"}}),
                ),
                "post": _operation(
                    "createItem",
                    "Add an item.",
                    tags=["items"],
                    requestBody={
                        "required": True,
                        "content": {
                            "application/json": {
                                "schema": {"type": "object", "properties": {"name": string}, "required": ["name"]}
                            }
                        },
                    },
                    responses={
                        "201": {
                            "description": "made",
                            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Item"}}},
                        }
                    },
                ),
            },
            "/items/{item_id}": {
                "get": _operation(
                    "getItem",
                    "One item by its id.",
                    _param("item_id", "path", string),
                    tags=["items"],
                    responses=_json_answer({"$ref": "#/components/schemas/Item"}),
                    **described,
                ),
            },
            "/me": {
                "get": _operation(
                    "whoAmI", "Whose token came.", tags=["items"], responses=_json_answer({"type": "object"})
                )
            },
            "/echo/{value}": {
                "get": _operation(
                    "echoPath",
                    "Say how the path arrived.",
                    _param("value", "path", string),
                    _param("note", "header", string),
                    tags=["probes"],
                    responses=_json_answer({"type": "object"}),
                ),
            },
            "/slow": {
                "get": _operation(
                    "slow",
                    "Answer after some seconds.",
                    _param("seconds", "query", {"type": "number"}, True),
                    tags=["probes"],
                    responses=_json_answer({"type": "object"}),
                )
            },
            "/fail": {
                "get": _operation(
                    "fail",
                    "Fail, repeating the credential it was sent.",
                    tags=["probes"],
                    responses=_json_answer({"type": "object"}),
                )
            },
            "/big": {
                "get": _operation(
                    "big",
                    "An answer of 3 MiB.",
                    tags=["probes"],
                    responses={"200": {"description": "text", "content": {"text/plain": {}}}},
                )
            },
            "/odata/Products": {
                "get": _operation(
                    "products",
                    "Products, as an OData service answers (XML).",
                    tags=["probes"],
                    responses={"200": {"description": "xml", "content": {"application/xml": {}}}},
                )
            },
            "/redirect/private": {
                "get": _operation(
                    "redirectPrivate",
                    "Redirect to a private address.",
                    tags=["probes"],
                    responses=_json_answer({"type": "object"}),
                )
            },
            "/redirect/home": {
                "get": _operation(
                    "redirectHome",
                    "Redirect within the service.",
                    tags=["probes"],
                    responses=_json_answer({"type": "object"}),
                )
            },
        },
        "components": {"schemas": {"Item": ITEM}},
    }


def hostile(name: str, port: int) -> bytes | None:
    """The hostile documents, by name."""
    base = {"openapi": "3.0.3", "info": {"title": "hostile", "version": "1"}}
    answer = {
        "200": {"description": "ok", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/A"}}}}
    }
    get = {"/a": {"get": {"operationId": "a", "responses": answer}}}
    documents = {
        "broken-ref.json": base | {"paths": get, "components": {"schemas": {"B": ITEM}}},
        "cycle.json": base
        | {
            "paths": get,
            "components": {
                "schemas": {
                    "A": {"type": "object", "properties": {"b": {"$ref": "#/components/schemas/B"}}},
                    "B": {"type": "object", "properties": {"a": {"$ref": "#/components/schemas/A"}}},
                }
            },
        },
        "external-ref.json": base
        | {
            "paths": get,
            "components": {
                "schemas": {"A": {"$ref": f"http://127.0.0.2:{port}/openapi.json#/components/schemas/Item"}}
            },
        },
        "servers-private.json": base
        | {"servers": [{"url": "http://10.0.0.1/api"}], "paths": get, "components": {"schemas": {"A": ITEM}}},
    }
    if name in documents:
        return json.dumps(documents[name]).encode()
    if name == "bomb.yaml":  # "billion laughs": nine levels of nine aliases each
        lines = ['openapi: "3.0.3"', "info: {title: bomb, version: '1'}", "a: &a [" + ",".join(['"lol"'] * 9) + "]"]
        for level in range(8):
            here, below = chr(98 + level), chr(97 + level)
            lines.append(f"{here}: &{here} [" + ",".join([f"*{below}"] * 9) + "]")
        return ("\n".join(lines) + "\npaths: {}\n").encode()
    return None


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go in two writes: Nagle would hold the body for an ACK

    def log_message(self, format: str, *args: Any) -> None:  # the tests read answers, not access logs
        pass

    def _send(self, status: int, body: bytes, content_type: str = "application/json", **headers: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in headers.items():
            self.send_header(name.replace("_", "-"), value)
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, value: Any) -> None:
        self._send(status, json.dumps(value).encode())

    def _caller(self) -> str | None:
        """Whose token the request carries (None: none the service knows)."""
        tokens = dict(
            entry.split(":", 1) if ":" in entry else ("service", entry)
            for entry in os.environ["REST_SERVICE_TOKEN"].split(",")
        )
        sent = self.headers.get("Authorization", "")
        return next((name for name, token in tokens.items() if sent == f"Bearer {token}"), None)

    def _allowed(self, path: str) -> bool:
        if not os.environ.get("REST_SERVICE_TOKEN") or path == "/openapi.json" or path.startswith("/hostile/"):
            return True
        return self._caller() is not None

    def do_GET(self) -> None:
        path, query = urlsplit(self.path).path, parse_qs(urlsplit(self.path).query)
        if not self._allowed(path):
            self._json(401, {"error": "a bearer token is required"})
        elif path == "/openapi.json":
            self._json(200, document(self.server.server_port))
        elif path == "/me":
            self._json(200, {"caller": self._caller()})
        elif path.startswith("/hostile/"):
            self._hostile(path.removeprefix("/hostile/"))
        elif path == "/items":
            limit = int(query.get("limit", ["10"])[0])
            self._json(200, [{"id": str(i), "name": f"item {i}"} for i in range(1, min(limit, 3) + 1)])
        elif path.startswith("/items/"):
            item = unquote(path.removeprefix("/items/"))
            self._json(404, {"error": f"no item {item}"}) if item == "missing" else self._json(
                200, {"id": item, "name": f"item {item}"}
            )
        elif path.startswith("/echo/"):
            self._json(
                200, {"raw_path": self.path, "segments": path.strip("/").split("/"), "note": self.headers.get("note")}
            )
        else:
            self._probe(path, query)

    def _probe(self, path: str, query: dict[str, list[str]]) -> None:
        port = self.server.server_port
        if path == "/slow":
            time.sleep(float(query["seconds"][0]))
            self._json(200, {"slept": float(query["seconds"][0])})
        elif path == "/fail":
            self._send(500, f"boom: the request carried {self.headers.get('Authorization')}".encode(), "text/plain")
        elif path == "/big":
            self._send(200, b"x" * BIG_BYTES, "text/plain")
        elif path == "/odata/Products":
            xml = b'<?xml version="1.0"?><feed><entry><title>Chai</title></entry></feed>'
            self._send(200, xml, "application/xml")
        elif path == "/redirect/private":
            self._send(302, b"", Location=f"http://127.0.0.2:{port}/items/1")
        elif path == "/redirect/home":
            self._send(302, b"", Location="/items/7")
        else:
            self._json(404, {"error": f"no such path {path}"})

    def _hostile(self, name: str) -> None:
        if name == "huge.json":  # streamed: 50 MB of one long description, never built in memory
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(HUGE_BYTES))
            self.end_headers()
            head = b'{"openapi": "3.0.3", "info": {"title": "huge", "version": "1", "description": "'
            tail = b'"}, "paths": {}}'
            self.wfile.write(head)
            chunk, left = b"y" * 65536, HUGE_BYTES - len(head) - len(tail)
            try:
                while left > 0:
                    self.wfile.write(chunk[:left])
                    left -= len(chunk)
                self.wfile.write(tail)
            except (BrokenPipeError, ConnectionResetError):  # the gateway stops reading at its limit
                pass
            return
        body = hostile(name, self.server.server_port)
        self._send(
            200, body, "application/yaml" if name.endswith(".yaml") else "application/json"
        ) if body else self._json(404, {"error": name})

    def do_POST(self) -> None:
        path = urlsplit(self.path).path
        if not self._allowed(path):
            self._json(401, {"error": "a bearer token is required"})
            return
        length = int(self.headers.get("Content-Length") or 0)
        sent = json.loads(self.rfile.read(length) or b"{}")
        if path == "/items" and isinstance(sent, dict) and isinstance(sent.get("name"), str):
            self._json(201, {"id": "42", "name": sent["name"]})
        else:
            self._json(400, {"error": "an item needs a name"})


def main() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler)
    server.daemon_threads = True
    print(f"rest service on http://127.0.0.1:{server.server_port}/openapi.json", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
