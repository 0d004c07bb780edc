"""Who hears of sign-off requests: listeners registered at start-up by a layer above, since policy imports none. Of
a new request (registry/apps.py wires registry/sign_off_notify.py), never of a call that joins one already open; of
a decision (handoff/apps.py wakes the calls waiting for it). Told once committed; a listener that fails is logged
(`on_commit(robust=True)`), never the call's or the decision's failure."""

from collections.abc import Callable

Listener = Callable[[str], None]
_asked_listeners: list[Listener] = []
_decided_listeners: list[Listener] = []


def on_sign_off_asked(listener: Listener) -> None:
    """`listener(sign_off_id)` hears of each request opened; it must return at once (the call waits for it)."""
    if listener not in _asked_listeners:
        _asked_listeners.append(listener)


def on_sign_off_decided(listener: Listener) -> None:
    """`listener(sign_off_id)` hears of each request granted or refused; it must return at once."""
    if listener not in _decided_listeners:
        _decided_listeners.append(listener)


def sign_off_asked_tell(sign_off_id: str) -> None:
    for listener in _asked_listeners:
        listener(sign_off_id)


def sign_off_decided_tell(sign_off_id: str) -> None:
    for listener in _decided_listeners:
        listener(sign_off_id)
