"""A virtual server's own tool overrides in the configuration document (docs/import.md): exported with the server,
imported back with nothing to change, changed and cleared through the service (audited), and every override the
import cannot apply refused whole, naming the server and the tool, with nothing written."""

import copy
from collections.abc import Iterator

import pytest

from handoff.config_apply import ConfigRefused, config_apply
from handoff.config_document import config_export
from registry.models import ServerToolOverride, VirtualServer
from registry.server_overrides import server_override_set, server_overrides_json
from tests.helpers import audit_mark, audit_since
from tests.registry.test_overrides import weather  # noqa: F401 (a fixture)

OUTLOOK = {"name": "outlook", "params": {"city": {"name": "town"}}}


@pytest.fixture
def desk(weather) -> Iterator[VirtualServer]:  # noqa: F811
    server = VirtualServer.objects.create(name="cfg-desk", tools=["meteo__*"])
    server_override_set(server=server, tool=weather, data={"name": "outlook"}, actor="test")
    yield server
    server.delete()


def test_a_servers_overrides_are_exported_and_imported_back_changed_and_cleared(desk):
    document, _ = config_export()
    unchanged = config_apply(document=document, actor="test")
    changed_doc = copy.deepcopy(document)
    changed_doc["virtualServers"]["cfg-desk"]["overrides"]["meteo/weather"] = OUTLOOK
    mark = audit_mark()
    changed = config_apply(document=changed_doc, actor="test")
    after_change = server_overrides_json(server=desk)
    del changed_doc["virtualServers"]["cfg-desk"]["overrides"]
    cleared = config_apply(document=changed_doc, actor="test")
    rows = [row.detail["action"] for row in audit_since(mark) if row.server == "cfg-desk"]

    assert document["virtualServers"]["cfg-desk"]["overrides"] == {"meteo/weather": {"name": "outlook"}}
    assert unchanged == []
    assert [change.line() for change in changed] == ["changed  virtual server cfg-desk: overrides"]
    assert after_change == {"meteo/weather": OUTLOOK}
    assert [change.line() for change in cleared] == ["changed  virtual server cfg-desk: overrides"]
    assert not ServerToolOverride.objects.filter(server=desk).exists()
    assert rows == ["server_override_set", "server_override_cleared"]


@pytest.mark.parametrize(
    "key, data, error",
    [
        ("meteo/nothing", OUTLOOK, "virtual server 'cfg-desk' overrides 'meteo/nothing', which the gateway's catalog "
                                   "does not have (sync it first)"),
        ("meteo/weather", {"rename": "x"}, "virtual server 'cfg-desk': the override of 'meteo/weather': An override "
         "is an object of annotations, description, name, output, params, title: 'rename' is not one of them."),
        ("meteo/weather", {"name": "alerts"}, "virtual server 'cfg-desk': override: Tools 'weather' and 'alerts' "
                                              "would both be exposed as 'meteo__alerts' in virtual server 'cfg-desk'."),
    ],
)  # fmt: skip
def test_an_override_the_import_cannot_apply_is_refused_naming_it_and_nothing_is_written(desk, key, data, error):
    document, _ = config_export()
    document["virtualServers"]["cfg-desk"]["overrides"] = {key: data}
    document["virtualServers"]["cfg-desk"]["title"] = "Never written"
    with pytest.raises(ConfigRefused) as refused:
        config_apply(document=document, actor="test")
    assert str(refused.value) == error
    assert VirtualServer.objects.get(name="cfg-desk").title == ""
    assert server_overrides_json(server=desk) == {"meteo/weather": {"name": "outlook"}}
