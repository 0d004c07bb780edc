"""`/mcp`'s own Streamable HTTP (handoff/endpoints/streamable_http/), on the wire: JSON answers unless the exchange
needs a stream, resumable streams, sessions and their bad input, in both eras."""

import json
import os

import httpx2
import pytest
import redis

from tests import servers
from tests.clients import TIMEOUT, sse_events
from tests.conftest import needs
from tests.helpers import audit_mark, audit_since, eventually

HEADERS = {"content-type": "application/json", "accept": "application/json, text/event-stream"}
INIT = {
    "jsonrpc": "2.0",
    "id": 0,
    "method": "initialize",
    "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
}
INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}
NOT_FOUND = "Session not found: it ended, expired or never existed; send initialize to open a new one"
MISMATCH = "Bad Request: MCP-Protocol-Version 2025-06-18 is not this session's (2025-11-25)"
MODERN = {"mcp-protocol-version": "2026-07-28"}
ENVELOPE = {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}}


def request(method: str, params: dict | None = None, request_id: int = 1) -> dict:
    return {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params or {}}


def progress_call(request_id: int = 1) -> dict:
    params = {"name": "demo__progress", "arguments": {"seconds": 0.5}, "_meta": {"progressToken": "p"}}
    return request("tools/call", params, request_id)


class Client:
    """A 2025-11-25 client on raw HTTP: what the SDK's client hides is what these tests look at."""

    def __init__(self, gateway, key: str) -> None:
        self.url, self.key, self.session = f"{gateway.url}/mcp", key, ""

    def headers(self, **more: str) -> dict[str, str]:
        session = {"mcp-session-id": self.session, "mcp-protocol-version": "2025-11-25"} if self.session else {}
        return HEADERS | {"authorization": f"Bearer {self.key}"} | session | more

    def post(self, body: dict, **headers: str) -> httpx2.Response:
        return httpx2.post(self.url, content=json.dumps(body), headers=self.headers(**headers), timeout=TIMEOUT)

    def open(self) -> "Client":
        opened = self.post(INIT)
        assert opened.status_code == 200, opened.text
        self.session = opened.headers["mcp-session-id"]
        assert self.post(INITIALIZED).status_code == 202
        return self

    def get(self, **headers: str) -> httpx2.Response:
        return httpx2.get(self.url, headers=self.headers(accept="text/event-stream", **headers), timeout=TIMEOUT)


def streamed(client: Client, body: dict) -> tuple[str, list[dict]]:
    with httpx2.stream("POST", client.url, content=json.dumps(body), headers=client.headers(), timeout=TIMEOUT) as r:
        return r.headers["content-type"], list(sse_events(r))


def test_a_request_with_nothing_to_stream_is_answered_as_json_in_both_eras(inline_gateway, world):
    client = Client(inline_gateway, world.key).open()
    legacy = client.post(request("tools/list"))
    assert legacy.headers["content-type"] == "application/json"
    assert legacy.headers["mcp-session-id"] == client.session
    assert "demo__progress" in {tool["name"] for tool in legacy.json()["result"]["tools"]}
    stateless = Client(inline_gateway, world.key).post(
        request("tools/list", {"_meta": ENVELOPE}), **MODERN, **{"mcp-method": "tools/list"}
    )
    assert stateless.status_code == 200 and stateless.headers["content-type"] == "application/json"
    assert "mcp-session-id" not in stateless.headers
    assert "demo__progress" in {tool["name"] for tool in stateless.json()["result"]["tools"]}


def test_a_call_that_reports_progress_is_a_resumable_stream_that_a_get_replays(inline_gateway, world):
    client = Client(inline_gateway, world.key).open()
    kind, events = streamed(client, progress_call(7))
    assert kind == "text/event-stream"
    priming, *sent = events
    assert priming["data"] == "" and priming["retry"] == "1000" and priming["id"]
    assert [e["data"]["method"] for e in sent[:-1]] == ["notifications/progress"] * (len(sent) - 1) != []
    assert sent[-1]["data"]["id"] == 7 and sent[-1]["data"]["result"]["content"][0]["text"] == "done"
    with httpx2.stream("GET", client.url, headers=client.headers(**{"last-event-id": priming["id"]})) as replay:
        assert replay.status_code == 200
        replayed = [e for e in sse_events(replay) if e.get("data")]
    assert [e["data"] for e in replayed] == [e["data"] for e in sent]
    assert [e["id"] for e in replayed] == [e["id"] for e in sent]


def test_a_stream_resumed_after_the_replay_bound_says_how_many_events_it_missed(server_env, world, logs):
    with servers.inline_gateway_with(
        server_env, logs / "gateway-replay-bound.log", GATEWAY_SSE_REPLAY_EVENTS="2"
    ) as gw:
        client = Client(gw, world.key).open()
        _, (priming, *sent) = streamed(client, progress_call())
        with httpx2.stream("GET", client.url, headers=client.headers(**{"last-event-id": priming["id"]})) as replay:
            said, *kept = list(sse_events(replay))
    assert said["data"]["method"] == "notifications/message" and "id" not in said
    assert said["data"]["params"]["data"].startswith(f"{len(sent) - 2} events of this stream were dropped")
    assert [e["data"] for e in kept if e.get("data")] == [e["data"] for e in sent[-2:]]


def test_a_last_event_id_of_another_session_or_no_stream_is_404(inline_gateway, world):
    mine, theirs = Client(inline_gateway, world.key).open(), Client(inline_gateway, world.key).open()
    _, (priming, *_) = streamed(theirs, progress_call())
    for event_id in (priming["id"], f"{mine.session[:8]}-99:1", "nonsense"):
        refused = mine.get(**{"last-event-id": event_id})
        assert refused.status_code == 404
        assert refused.json()["error"] == {
            "code": -32600,
            "message": "Not Found: Last-Event-ID names no stream of this session",
        }


def test_a_get_stream_gets_what_the_session_is_sent_and_a_second_one_is_409(inline_gateway, world):
    client = Client(inline_gateway, world.key).open()
    with httpx2.stream("GET", client.url, headers=client.headers(accept="text/event-stream")) as listening:
        assert listening.status_code == 200 and listening.headers["content-type"] == "text/event-stream"
        second = client.get()
        assert second.status_code == 409
        assert second.json()["error"]["message"] == "Conflict: the session has a GET stream open"
        events = sse_events(listening)
        assert next(events)["data"] == ""  # primed, so that it can be resumed
    again = eventually(lambda: client.get(**{"last-event-id": "x"}))  # the first is gone: no 409 for a resume
    assert again.status_code == 404


@pytest.mark.parametrize(
    ("headers", "status", "message"),
    [
        ({"accept": "application/json"}, 406, "Not Acceptable: a GET must accept text/event-stream"),
        ({"mcp-session-id": ""}, 400, "Bad Request: Missing session ID"),
        ({"mcp-session-id": "0" * 32}, 404, NOT_FOUND),
        (
            {"mcp-protocol-version": "2025-06-18"},
            400,
            MISMATCH,
        ),
    ],
)
def test_a_get_with_bad_headers_is_refused(inline_gateway, world, headers, status, message):
    client = Client(inline_gateway, world.key).open()
    sent = client.headers(accept="text/event-stream") | headers
    refused = httpx2.get(client.url, headers={k: v for k, v in sent.items() if v}, timeout=TIMEOUT)
    assert (refused.status_code, refused.json()["error"]["message"]) == (status, message)


def test_a_post_without_a_session_id_or_with_another_version_is_refused(inline_gateway, world):
    client = Client(inline_gateway, world.key)
    missing = client.post(request("tools/list"))
    assert (missing.status_code, missing.json()["error"]["message"]) == (400, "Bad Request: Missing session ID")
    client.open()
    other = client.post(request("tools/list"), **{"mcp-protocol-version": "2025-06-18"})
    assert other.status_code == 400
    assert other.json()["error"]["message"] == MISMATCH


def test_delete_ends_the_session_and_says_so_in_the_audit(inline_gateway, world, db):
    client = Client(inline_gateway, world.key).open()
    mark = audit_mark()
    deleted = httpx2.delete(client.url, headers=client.headers(), timeout=TIMEOUT)
    assert deleted.status_code == 200
    after = client.post(request("tools/list"))
    assert (after.status_code, after.json()["error"]["message"]) == (404, NOT_FOUND)
    closed = eventually(lambda: [e for e in audit_since(mark, sessions=True) if e.session_id == client.session])
    assert [(e.detail["action"], e.detail["reason"]) for e in closed] == [("session_closed", "deleted by the client")]


def test_a_method_other_than_get_post_delete_is_405(inline_gateway, world):
    refused = httpx2.put(f"{inline_gateway.url}/mcp", headers=Client(inline_gateway, world.key).headers())
    assert refused.status_code == 405 and refused.headers["allow"] == "GET, POST, DELETE"


def test_a_stateless_initialize_or_get_is_refused_as_the_era_says(inline_gateway, world):
    client = Client(inline_gateway, world.key)
    initialize = client.post(INIT, **MODERN)
    assert initialize.status_code == 404 and initialize.json()["error"]["code"] == -32601
    listen = httpx2.get(client.url, headers=client.headers(**MODERN), timeout=TIMEOUT)
    assert (listen.status_code, listen.headers["allow"], listen.headers["content-length"]) == (405, "POST", "0")


def test_a_stateless_notification_is_taken_with_an_empty_answer_of_length_0(inline_gateway, world):
    taken = Client(inline_gateway, world.key).post(INITIALIZED, **MODERN)
    assert (taken.status_code, taken.headers["content-length"], taken.content) == (202, "0", b"")
    assert "transfer-encoding" not in taken.headers


def _session_key(client: Client) -> str:
    return f"sb:mcp-session:{client.session}"


def test_a_session_whose_record_redis_lost_or_someone_forged_is_told_to_initialise_again(inline_gateway, world):
    needs(bool(os.environ.get("REDIS_URL")), "REDIS_URL is not set: sessions are held in the process")
    store = redis.Redis.from_url(os.environ["REDIS_URL"])
    lost, forged = Client(inline_gateway, world.key).open(), Client(inline_gateway, world.key).open()
    assert store.exists(_session_key(lost)) and store.exists(_session_key(forged))
    store.delete(_session_key(lost))  # what a flushed or restarted Redis leaves
    store.set(_session_key(forged), b"a record nobody signed")
    for client in (lost, forged):
        refused = client.post(request("tools/list"))
        assert (refused.status_code, refused.json()["error"]["message"]) == (404, NOT_FOUND)
    assert "does not verify: refused" in inline_gateway.log.read_text()
    again = Client(inline_gateway, world.key).open()
    assert again.post(request("tools/list")).status_code == 200
