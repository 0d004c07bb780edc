"""Upstream credentials are sealed at rest with the executor's public key; only a process holding a private
key opens them (the Celery worker; the web process only in the embedded default). Keys rotate. No secret
appears in a log line, an audit row, an error or the admin."""

import json
import uuid

import pytest
from django.core.management import call_command
from django.test import override_settings
from mcp import types

from audit.models import AuditEvent
from gateway_project.lib.keys import key_generate
from registry.credentials import (
    CredentialError,
    credential_open,
    credential_seal,
    credentials_open,
    public_key_of,
)
from registry.models import Upstream
from registry.services import upstream_save
from tests.clients import call, sdk_client, tool_names
from tests.factories import demo_upstream, team
from tests.helpers import audit_mark, eventually, run, until

CANARY = "canary-7f3a9c-do-not-log"


def test_a_sealed_value_holds_no_plaintext_and_opens_only_under_its_own_name():
    with override_settings(GATEWAY_CREDENTIAL_KEYS=[key_generate()], GATEWAY_CREDENTIAL_PUBLIC_KEY=""):
        sealed = credential_seal(CANARY, name="API_TOKEN")
        assert CANARY not in sealed and sealed.startswith("sbx1:")
        assert credential_open(sealed, name="API_TOKEN") == CANARY
        assert credential_seal(CANARY, name="API_TOKEN") != sealed, "every sealing is fresh"
        with pytest.raises(CredentialError, match="does not open: altered, or moved from another name"):
            credential_open(sealed, name="OTHER_TOKEN")


def test_a_process_with_the_public_key_alone_seals_but_cannot_open():
    private = key_generate()
    with override_settings(GATEWAY_CREDENTIAL_KEYS=[], GATEWAY_CREDENTIAL_PUBLIC_KEY=public_key_of(private)):
        sealed = credential_seal(CANARY, name="API_TOKEN")
        with pytest.raises(CredentialError, match="which this process does not hold"):
            credential_open(sealed, name="API_TOKEN")
    with override_settings(GATEWAY_CREDENTIAL_KEYS=[private], GATEWAY_CREDENTIAL_PUBLIC_KEY=""):
        assert credential_open(sealed, name="API_TOKEN") == CANARY


def test_rotation_reseals_every_credential_with_the_newest_key_audited_under_each_team(db, settings, capsys):
    current, newest = settings.GATEWAY_CREDENTIAL_KEYS[0], key_generate()
    with team("rotators") as rotators:
        upstream = Upstream(slug="rotated", transport="stdio", command="true", env={"API_TOKEN": CANARY})
        upstream_save(upstream=upstream, created=True)
        theirs = Upstream(slug="rotated-too", transport="stdio", command="true", env={"T": CANARY}, team=rotators)
        upstream_save(upstream=theirs, created=True)
        mark = audit_mark()
        try:
            with override_settings(GATEWAY_CREDENTIAL_KEYS=[newest, current], GATEWAY_CREDENTIAL_PUBLIC_KEY=""):
                call_command("rotate_credentials")
            upstream.refresh_from_db()
            with override_settings(GATEWAY_CREDENTIAL_KEYS=[newest], GATEWAY_CREDENTIAL_PUBLIC_KEY=""):
                assert credentials_open(upstream.env) == {"API_TOKEN": CANARY}
            assert upstream.revision == 1, "the same secret: no reconnect"
            assert "resealed the credentials of 2 upstream(s) with the newest key" in capsys.readouterr().out
            rows = AuditEvent.objects.filter(id__gt=mark, detail__action="credentials_resealed").order_by("team")
            assert [(row.team, row.detail["upstreams"]) for row in rows] == [("default", 1), ("rotators", 1)]
        finally:
            upstream.delete()


def test_a_credential_reaches_the_upstream_and_nothing_else(gateway, world, logs, admin_client, capfd):
    """Through both executors: with Celery, the web process holds only the public key (conftest), so the
    worker opened the value."""
    with demo_upstream("keyed", env={"DEMO_SECRET": CANARY}) as keyed:
        eventually(lambda: "keyed__env" in run(lambda: tool_names(gateway.url, world.key)))
        seen = run(lambda: call(gateway.url, world.key, "keyed__env", {"name": "DEMO_SECRET"}))
        run(lambda: call(gateway.url, world.key, "keyed__leak", {"how": "error"}))
        echoed = run(lambda: call(gateway.url, world.key, "keyed__leak", {"how": "own-key"}))
        page = admin_client.get(f"/admin/registry/upstream/{keyed.pk}/change/").content.decode()
        stored = json.dumps(Upstream.objects.filter(pk=keyed.pk).values("env").get())
    # It got the very value: what it echoes is blanked out as the value, in a successful result too.
    assert seen.content[0].text == "[credential]"
    # The upstream's error repeats the key it was given: the executor blanks it out for model and audit alike.
    assert echoed.is_error and echoed.content[0].text == (
        "keyed__leak: The service refused the request: invalid key [credential]: try another"
    )
    assert CANARY not in page and "DEMO_SECRET" in page
    assert CANARY not in stored
    for row in AuditEvent.objects.values():
        assert CANARY not in json.dumps(row, default=str)
    captured = capfd.readouterr()
    assert CANARY not in captured.out + captured.err, "the secret is in this process's output"
    for log in logs.iterdir():
        assert CANARY not in log.read_text(errors="replace"), f"the secret is in {log.name}"


def test_what_an_upstream_sends_while_it_works_reaches_the_agent_with_its_credential_blanked(gateway, world):
    """Progress, log messages and a question pushed on the call's stream (a 2025-11-25 upstream's sampling
    request) travel through the executor's relay, which blanks the upstream's own credential out of them as the
    executor does out of results. The agent's answer goes back as it was."""
    secret, slug = "relay-canary-5d1e0b", f"keyed-{uuid.uuid4().hex[:8]}"
    heard: list[tuple[str, str]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        heard.append(("progress", str(message)))

    async def on_log(params: types.LoggingMessageNotificationParams) -> None:
        heard.append(("log", str(params.data)))

    async def on_sampling(context, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
        heard.append(("sampling", params.messages[0].content.text))
        return types.CreateMessageResult(role="assistant", content=types.TextContent(type="text", text="ok"), model="m")

    async def scenario() -> str:
        options = {"logging_callback": on_log, "sampling_callback": on_sampling}
        async with sdk_client(gateway.url, world.key, "legacy", **options) as client:
            await client.set_logging_level("warning")
            arguments = {"seconds": 0.1, "message": f"using {secret}"}
            await client.call_tool(f"{slug}__progress", arguments, progress_callback=on_progress)
            await client.call_tool(f"{slug}__log", {"text": secret})
            asked = await client.call_tool(f"{slug}__ask", {"question": f"is {secret} right?", "of": "sampling"})
            await until(lambda: any(kind == "log" for kind, _ in heard))  # its callback may trail the call's result
            return asked.content[0].text

    with demo_upstream(slug, env={"DEMO_SECRET": secret, "DEMO_LEGACY_ONLY": "1"}):
        eventually(lambda: f"{slug}__ask" in run(lambda: tool_names(gateway.url, world.key)))
        answered = run(scenario)
    assert sorted(heard) == [
        ("log", "a warning message: [credential]"),
        ("progress", "using [credential]"),
        ("sampling", "is [credential] right?"),
    ]
    assert answered == "the model said: ok"
