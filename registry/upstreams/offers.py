"""What catalog sync reads of an upstream besides its tools, for the pins (registry/pinned_items.py): every
resource, resource template and prompt it lists, and the text of each prompt that needs no argument.

A list the upstream does not offer is empty; one it fails to answer is None, so the sync leaves that kind's
pins as they are instead of reading the failure as "all removed"."""

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from mcp import InputRequiredRoundsExceededError, types
from mcp.shared.exceptions import MCPError
from pydantic import ValidationError

logger = logging.getLogger(__name__)

MAX_PAGES = 100  # per list: an upstream whose cursors never end cannot hold the sync forever
MAX_PROMPT_TEXTS = 200  # prompts/get round trips per sync; prompts past it are pinned without their text
FAILED = (MCPError, ValidationError, InputRequiredRoundsExceededError)

# The lists read: the key the sync stores them under, the capability they need, the page's field, the call.
LISTS: dict[str, tuple[str, str, Callable[[Any, str | None], Awaitable[Any]]]] = {
    "resources": ("resources", "resources", lambda c, cursor: c.list_resources(cursor=cursor, cache_mode="bypass")),
    "resourceTemplates": (
        "resources",
        "resource_templates",
        lambda c, cursor: c.list_resource_templates(cursor=cursor, cache_mode="bypass"),
    ),
    "prompts": ("prompts", "prompts", lambda c, cursor: c.list_prompts(cursor=cursor, cache_mode="bypass")),
}


def _dump(item: Any) -> dict[str, Any]:
    wire = item.model_dump(mode="json", by_alias=True, exclude_none=True)
    wire.pop("_meta", None)
    return wire


async def _every_page(client: Any, capability: str, field: str, page_of: Callable) -> list[dict[str, Any]] | None:
    if getattr(client.server_capabilities, capability, None) is None:
        return []
    items, cursor = [], None
    try:
        for _ in range(MAX_PAGES):
            page = await page_of(client, cursor)
            items += [_dump(item) for item in getattr(page, field)]
            if not (cursor := page.next_cursor):
                break
    except FAILED as exc:
        if isinstance(exc, MCPError) and exc.code == types.CONNECTION_CLOSED:
            raise
        logger.warning("catalog sync could not list %s: %s", field, exc)
        return None
    return items


def _needs_no_argument(prompt: dict[str, Any]) -> bool:
    return not any(isinstance(a, dict) and a.get("required") for a in prompt.get("arguments") or [])


async def _text(client: Any, name: str) -> dict[str, Any] | None:
    """What prompts/get gives without arguments (its description and messages), or None if it gives nothing."""
    try:
        return _dump(await client.get_prompt(name))
    except FAILED as exc:
        if isinstance(exc, MCPError) and exc.code == types.CONNECTION_CLOSED:
            raise
        logger.warning("catalog sync could not get prompt %r: %s", name, exc)
        return None


async def offers(client: Any) -> dict[str, list[dict[str, Any]] | None]:
    """Resources, resource templates and prompts (each prompt that needs no argument with its `text`)."""
    found = {key: await _every_page(client, *how) for key, how in LISTS.items()}
    fetched = 0
    for prompt in found["prompts"] or []:
        if isinstance(prompt.get("name"), str) and _needs_no_argument(prompt) and fetched < MAX_PROMPT_TEXTS:
            fetched += 1
            if (text := await _text(client, prompt["name"])) is not None:
                prompt["text"] = text
    return found
