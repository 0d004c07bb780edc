"""The first look at a frame (handoff/mcp/frames.py): its surrogate checks run where its bytes can hold one."""

import json

import pytest
from mcp import types

from handoff.mcp.frames import FrameError, parse_frame

CALL = '{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"t","arguments":{"a":"%s"}}}'


@pytest.mark.parametrize(
    "raw",
    [
        (CALL % "x\ud800y").encode("utf-8", "surrogatepass"),  # encoded as UTF-8 bytes, no escape
        (CALL % "\\uDBFF").encode(),  # an escape in capitals
        (CALL % "\ud800").encode("utf-16", "surrogatepass"),  # a UTF-16 body, which json.loads also reads
        CALL % "\ud800",  # text, as a WebSocket frame comes
    ],
    ids=["utf-8 bytes", "escape", "utf-16", "text"],
)
def test_arguments_holding_a_lone_surrogate_are_invalid_params_however_the_frame_spells_it(raw):
    with pytest.raises(FrameError) as refused:
        parse_frame(raw)
    assert refused.value.code == types.INVALID_PARAMS and refused.value.request_id == 7


def test_a_frame_with_paired_surrogates_and_text_near_them_is_served():
    raw = (CALL % "\\ud83d\\ude00 \ud55c").encode()  # an escaped pair, and Hangul (its UTF-8 starts ED 95)
    assert parse_frame(raw)["params"]["arguments"] == {"a": "\U0001f600 \ud55c"}


def test_a_frame_with_more_brackets_than_the_limit_in_its_strings_alone_is_served(settings):
    settings.GATEWAY_MAX_JSON_DEPTH = 8
    raw = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "ping", "params": {"text": "[{" * 20}}).encode()
    assert parse_frame(raw)["params"]["text"] == "[{" * 20
    with pytest.raises(FrameError):
        parse_frame(b'{"jsonrpc":"2.0","id":1,"method":"ping","params":' + b"[" * 9 + b"]" * 9 + b"}")
