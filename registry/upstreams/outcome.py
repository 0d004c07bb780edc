"""What every upstream request comes back as: an `Outcome` (plain JSON, so that it crosses a Celery queue as it
is), the failures made from a code and a message, and the codes other layers recognise."""

from typing import Any, TypedDict

MISSING_CLIENT_CAPABILITY = -32021  # 2026-07-28: the request needs a capability the client did not declare
TUNNEL_GONE = "HANDOFF_UPSTREAM_UNAVAILABLE"
DOCUMENT_REFUSED = "REST_DOCUMENT_REFUSED"  # a REST upstream's OpenAPI document (registry/rest/document.py)
DELEGATION_MISSING = "MISSING_DELEGATION_TOKEN"  # a guarded specialist's refusal of a request without one


class Outcome(TypedDict, total=False):
    ok: bool
    result: Any  # the upstream's result, JSON, when ok
    code: str  # when not ok: a stable error code
    message: str  # when not ok: for the model (redacted later)
    detail: str  # when not ok: the full story, for the audit only
    validation: bool  # when not ok: the message judges the call's arguments (kept whole for the model)
    rpc_code: int  # when the upstream answered with a JSON-RPC error: its code
    rpc_data: dict[str, Any]  # and, for a missing client capability, its data
    cause: str  # when the upstream could not be reached: why, for the operator (registry/upstreams/health.py)


def failure(code: str, message: str, detail: str = "") -> Outcome:
    return {"ok": False, "code": code, "message": message, "detail": detail or message}


CONNECT_TIMEOUT = failure("UPSTREAM_CONNECT_TIMEOUT", "The service did not answer while connecting. Try later.")
