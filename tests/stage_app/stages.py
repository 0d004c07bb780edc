"""An operator's stages, as a test app plugs them in (GATEWAY_EXTRA_APPS=tests.stage_app): each acts only on a
call whose `text` argument starts with its marker, so the app leaves every other call alone."""

from typing import Any

from handoff.stages import StageCall, StageRefusal, after_execute, before_execute


@before_execute(name="test_refuser")
async def refuser(call: StageCall) -> None:
    text = str(call.arguments.get("text", ""))
    if text.startswith("refuse:"):
        raise StageRefusal("NOT_THIS_TEXT", f"{call.tool} may not be called with {text!r} here.")
    if text.startswith("break before:"):
        raise RuntimeError("the stage's own bug")


@after_execute(name="test_shouter")
def shouter(call: StageCall, result: dict[str, Any]) -> Any:
    text = str(call.arguments.get("text", ""))
    if text.startswith("shout:"):
        return result | {"content": [{"type": "text", "text": item["text"].upper()} for item in result["content"]]}
    if text.startswith("malformed:"):
        return {"content": "not a list"}
    if text.startswith("malformed in place:"):  # the very result it was given, changed: checked all the same
        result["content"] = "not a list"
    return result
