"""The REST API's refusals as its OpenAPI schema states them: every operation may answer 400 (field errors),
401, 403, 404 and 429 (with Retry-After), in the shapes Django REST framework sends. drf-spectacular
documents only success by default, so generated clients would not know them."""

from typing import Any

DETAIL = {
    "type": "object",
    "properties": {"detail": {"type": "string", "description": "What went wrong, for a person"}},
    "required": ["detail"],
}
FIELD_ERRORS = {
    "type": "object",
    "description": "Each refused field (or `non_field_errors`) with its messages; or `detail` alone",
    "additionalProperties": {"oneOf": [{"type": "array", "items": {"type": "string"}}, {"type": "string"}]},
}
REFUSALS = {
    "400": ("The request is invalid: see the field errors", "FieldErrors"),
    "401": ("No admin token, or an unknown, revoked or expired one", "Detail"),
    "403": ("The token's user lacks the permission this needs", "Detail"),
    "404": ("No such object", "Detail"),
    "429": ("Too many requests for this token (GATEWAY_API_RATE); retry after Retry-After seconds", "Detail"),
}
RETRY_AFTER = {"Retry-After": {"schema": {"type": "integer"}, "description": "Seconds to wait"}}


def document_refusals(result: dict[str, Any], generator: Any, request: Any, public: bool) -> dict[str, Any]:
    """drf-spectacular postprocessing hook: adds the refusals to every operation that does not state its own."""
    schemas = result.setdefault("components", {}).setdefault("schemas", {})
    schemas |= {"Detail": DETAIL, "FieldErrors": FIELD_ERRORS}
    for path in result.get("paths", {}).values():
        for operation in path.values():
            responses = operation.setdefault("responses", {})
            for status, (description, shape) in REFUSALS.items():
                content = {"application/json": {"schema": {"$ref": f"#/components/schemas/{shape}"}}}
                refusal = {"description": description, "content": content}
                responses.setdefault(status, refusal | ({"headers": RETRY_AFTER} if status == "429" else {}))
    return result
