"""Who hears of a new sign-off request: listeners registered at start-up by a layer above (registry/apps.py wires
registry/sign_off_notify.py), since policy imports none. Told once the request is committed, never for a call that
joins one already open; a listener that fails is logged (`on_commit(robust=True)`), never the call's failure."""

from collections.abc import Callable

AskedListener = Callable[[str], None]
_asked_listeners: list[AskedListener] = []


def on_sign_off_asked(listener: AskedListener) -> None:
    """`listener(sign_off_id)` hears of each request opened; it must return at once (the call waits for it)."""
    if listener not in _asked_listeners:
        _asked_listeners.append(listener)


def sign_off_asked_tell(sign_off_id: str) -> None:
    for listener in _asked_listeners:
        listener(sign_off_id)
