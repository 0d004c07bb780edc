"""The console in a real browser (Debian's Chromium, driven by Playwright): an operator logs in, reads the
dashboard, switches an upstream off and sees it vanish for an agent, approves a held tool, filters the audit
trail, opens one request's story and exports a slice. Screenshots go to $SWITCHBOARD_SCREENSHOTS (the ones
in docs/img/ were made this way)."""

import csv
import io
import json
import os
import uuid
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import pytest
from mcp.shared.exceptions import MCPError
from playwright.sync_api import Browser, Page

from audit.models import AuditEvent
from gateway_project.dashboard import REFRESH_SECONDS
from handoff.console import CONSOLE_AGENT
from policy.models import Agent
from registry.models import Tool
from registry.services import upstream_catalog_sync
from tests import servers
from tests.clients import call, tool_names
from tests.factories import demo_upstream
from tests.helpers import T, audit_mark, audit_since, eventually, run

PASSWORD = "console-pw-for-tests-only"
TIMEOUT_MS = 10_000


@pytest.fixture(scope="module")
def console(server_env, world, logs) -> Iterator[servers.Running]:
    """A gateway that keeps argument payloads, so the audit's payload view has something to show."""
    with servers.inline_gateway_with(server_env, logs / "gateway-console.log", GATEWAY_AUDIT_PAYLOADS="1") as running:
        yield running


@contextmanager
def logged_in(browser: Browser, url: str) -> Iterator[Page]:
    """A superuser, "console-op", logged in through the login form of the gateway at `url`."""
    from django.contrib.auth import get_user_model

    user = get_user_model().objects.create_superuser("console-op", password=PASSWORD)
    try:
        with signed_in(browser, url, "console-op", ready="#dashboard") as page:
            yield page
    finally:
        user.delete()


@contextmanager
def signed_in(browser: Browser, url: str, username: str, ready: str) -> Iterator[Page]:
    """A browser page signed in as `username` through the login form, once `ready` is on the page after it."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000}, accept_downloads=True)
    page = context.new_page()
    page.set_default_timeout(TIMEOUT_MS)
    try:
        page.goto(f"{url}/admin/login/")
        page.fill("#id_username", username)
        page.fill("#id_password", PASSWORD)
        page.click("input[type=submit]")
        page.wait_for_selector(ready)
        yield page
    finally:
        context.close()


@pytest.fixture
def operator(db, console, browser) -> Iterator[Page]:
    with logged_in(browser, console.url) as page:
        yield page


def agent_run(scenario: Callable[[], Awaitable[T]]) -> T:
    """An MCP client scenario, on a thread of its own: this one holds Playwright's event loop."""
    with ThreadPoolExecutor(1) as thread:
        return thread.submit(run, scenario).result()


def screenshot(page: Page, name: str) -> None:
    folder = Path(os.environ.get("SWITCHBOARD_SCREENSHOTS", "var/screenshots"))
    folder.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=folder / name, full_page=True)


def test_an_operator_logs_in_and_the_dashboard_charts_each_upstreams_calls(operator, console, world):
    for text in ("one", "two"):
        agent_run(lambda text=text: call(console.url, world.key, "demo__echo", {"text": text}))
    agent_run(lambda: call(console.url, world.key, "demo__fail"))
    operator.reload()
    drawn = operator.evaluate(
        """() => Object.fromEntries(["chart-calls", "chart-errors", "chart-latency"].map(
            id => [id, Chart.getChart(id).data.datasets.map(d => d.label)]))"""
    )
    assert "demo" in drawn["chart-calls"] and "demo" in drawn["chart-errors"]
    assert {"demo p50", "demo p95"} <= set(drawn["chart-latency"])
    totals = operator.locator("#upstream-totals tr", has_text="demo").first
    assert int(totals.locator("td").nth(1).inner_text()) >= 3
    screenshot(operator, "dashboard.png")
    operator.click("#upstream-totals a:text('demo')")
    operator.wait_for_selector("#audit-rows")
    assert operator.input_value("#id_upstream") == "demo"


def test_the_dashboard_lists_an_idle_upstream_and_refreshes_its_figures_without_a_reload(operator, console, world):
    """Its clock run forward (Playwright's), so the refresh comes at once: the new call's count appears in the
    page as it was, not a new one."""
    with demo_upstream("quiet") as quiet:
        operator.clock.install()
        operator.goto(f"{console.url}/admin/")
        row = operator.locator("#upstream-totals tr", has=operator.locator("a", has_text="quiet"))
        assert row.locator("td").nth(1).inner_text() == "0", "enabled and idle: listed with no calls"
        operator.evaluate("() => { window.sameDocument = true; }")
        agent_run(lambda: call(console.url, world.key, "quiet__echo", {"text": "now"}))
        operator.clock.run_for(REFRESH_SECONDS * 1000)
        quiet_calls = """() => [...document.querySelectorAll("#upstream-totals tr")]
            .filter(tr => tr.cells[0].innerText === "quiet").map(tr => tr.cells[1].innerText).join()"""
        eventually(lambda: operator.evaluate(quiet_calls) == "1", timeout=TIMEOUT_MS / 1000)
        assert operator.evaluate("() => window.sameDocument") is True, "the page was not reloaded"
        assert quiet.slug in operator.evaluate("() => Chart.getChart('chart-calls').data.datasets.map(d => d.label)")
        screenshot(operator, "dashboard-refreshed.png")


def test_disabling_an_upstream_in_the_console_hides_it_from_an_agent(operator, console, world):
    with demo_upstream("browsed"):
        eventually(lambda: "browsed__echo" in agent_run(lambda: tool_names(console.url, world.key)))
        operator.goto(f"{console.url}/admin/registry/upstream/")
        operator.locator("tr", has=operator.locator("a", has_text="browsed")).locator("input.action-select").check()
        operator.select_option("select[name=action]", "disable")
        operator.click("button[name=index]")
        operator.wait_for_selector("text=disabled")
        offered = eventually(lambda: (n := agent_run(lambda: tool_names(console.url, world.key))) and n)
        eventually(lambda: "browsed__echo" not in agent_run(lambda: tool_names(console.url, world.key)))
        assert "demo__echo" in offered


def test_a_held_tool_approved_in_the_console_is_offered_again(operator, console, world, tmp_path):
    manifest = tmp_path / "manifest.json"
    manifest.write_text("{}")
    with demo_upstream("pinned", env={"DEMO_MANIFEST": str(manifest)}) as upstream:
        manifest.write_text(json.dumps({"descriptions": {"echo": "Echo, and something new."}}))
        assert upstream_catalog_sync(upstream=upstream).held == ["echo"]
        eventually(lambda: "pinned__echo" not in agent_run(lambda: tool_names(console.url, world.key)))
        operator.goto(f"{console.url}/admin/")
        operator.click("#pending-tools")
        operator.click("a:text-is('echo')")
        operator.click("text=Approve this version")
        operator.wait_for_selector("text=agents see this version now")
        assert Tool.objects.get(upstream=upstream, name="echo").is_approved
        eventually(lambda: "pinned__echo" in agent_run(lambda: tool_names(console.url, world.key)))


def test_an_operator_overrides_a_tool_on_its_page_and_an_agent_sees_it_renamed(operator, console, world):
    with demo_upstream("dressed") as upstream:
        add = Tool.objects.get(upstream=upstream, name="add")
        operator.goto(f"{console.url}/admin/registry/tool/{add.pk}/change/")
        operator.click("#override-tool")
        operator.fill("#tool-override-text", json.dumps({"params": {"a": {"hidden": True}}}))
        operator.click("input[value=Save]")
        refused = operator.inner_text("#tool-override-error")
        operator.fill("#tool-override-text", json.dumps({"name": "sum", "params": {"b": {"value": 10}}}))
        operator.click("input[value=Save]")
        operator.wait_for_selector("text=agents see the change within seconds")
        shown = operator.inner_text("#tool-override")
        eventually(lambda: "dressed__sum" in agent_run(lambda: tool_names(console.url, world.key)))
        # The gateway's first call starts the upstream: on a loaded machine that may outlast the client's wait.
        answered = eventually(
            lambda: (
                (r := agent_run(lambda: call(console.url, world.key, "dressed__sum", {"a": 5})))
                and not isinstance(r, MCPError)
                and r
            ),
            timeout=30,
        )
        rows = AuditEvent.objects.filter(upstream="dressed")  # every call finished before the next test looks
        eventually(lambda: rows.filter(kind="approved").count() == rows.filter(kind="completed").count(), timeout=30)
    assert refused == "Parameter 'a' is required: give it a fixed value to hide it."
    assert json.loads(shown) == {"name": "sum", "params": {"b": {"value": 10}}}
    assert answered.content[0].text == "15"


def test_the_audit_list_filters_opens_a_requests_story_and_exports_the_slice(operator, console, world):
    marker = uuid.uuid4().hex
    agent_run(lambda: call(console.url, world.key, "demo__echo", {"text": marker}))
    agent_run(lambda: call(console.url, world.key, "demo__fail"))
    operator.goto(f"{console.url}/admin/audit/auditevent/")
    operator.fill("#id_upstream", "demo")
    operator.fill("#id_tool", "fail")
    operator.select_option("#id_outcome", "error")
    operator.click("#audit-filters button")
    rows = operator.locator("#audit-rows tbody tr")
    rows.first.wait_for()
    assert all("fail" in text and "error" in text for text in rows.all_inner_texts())
    screenshot(operator, "audit-list.png")

    with operator.expect_download() as download:
        operator.click("#export-csv")
    exported = list(csv.DictReader(io.StringIO(Path(download.value.path()).read_text())))
    assert exported and {(r["upstream"], r["tool"], r["outcome"]) for r in exported} == {("demo", "fail", "error")}

    operator.locator("#audit-rows a.request-link").first.click()
    story = operator.locator(".audit-step h2")
    assert [title.split(" ")[0] for title in story.all_inner_texts()] == ["approved", "completed"]
    failure = operator.locator(".audit-step").nth(1).inner_text()
    assert "TOOL_ERROR" in failure and "this tool always fails" in failure

    echoed = AuditEvent.objects.filter(kind="approved", detail__arguments__text=marker).get()
    operator.goto(f"{console.url}/admin/audit/auditevent/request/{echoed.request_id}/")
    assert "members of the Auditor group can see them" in operator.content()
    assert marker not in operator.content(), "a superuser outside the Auditor group sees no payloads"


@pytest.mark.parametrize("served_by", ["console", "celery_gateway"])
def test_an_operator_tests_a_tool_from_its_page_and_reads_the_result(request, served_by, browser, world):
    """Served by Daphne in either executor: the form, the warning, the result, and the trail naming the
    operator."""
    running = request.getfixturevalue(served_by)
    marker, mark = uuid.uuid4().hex, audit_mark()
    with demo_upstream("tried") as upstream, logged_in(browser, running.url) as page:
        try:
            echo = Tool.objects.get(upstream=upstream, name="echo")
            page.goto(f"{running.url}/admin/registry/tool/{echo.pk}/change/")
            page.click("#test-tool")
            page.get_by_label("text").fill(f"<b>{marker}</b>")
            page.click("#tool-test-form input[type=submit]")
            assert "may change data or act outside the gateway" in page.inner_text("#side-effects")
            page.click("#tool-test-confirm input[name=confirmed]")
            shown = page.inner_text("#tool-test-result")
            assert json.loads(shown)["content"] == [{"type": "text", "text": f"<b>{marker}</b>"}]
            assert page.locator("#tool-test-result b").count() == 0, "the result is text, not markup"
            page.click("#tool-test-request")
            steps = [title.split(" ")[0] for title in page.locator(".audit-step h2").all_inner_texts()]
            assert steps == ["approved", "completed"]
            assert "console-op" in page.inner_text("#content")
            rows = [r for r in audit_since(mark) if r.kind in ("approved", "completed")]
            assert [(r.kind, r.upstream, r.agent_name, r.actor) for r in rows] == [
                (kind, "tried", CONSOLE_AGENT, "console-op") for kind in ("approved", "completed")
            ]
        finally:
            Agent.objects.filter(name=CONSOLE_AGENT).delete()


@contextmanager
def team_admin_signed_in(browser: Browser, url: str, name: str, team) -> Iterator[Page]:
    """A staff account with every permission on owned objects, `admin` of `team` only, signed in by the form."""
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Permission

    from policy.models import TeamMember

    user = get_user_model().objects.create_user(name, password=PASSWORD, is_staff=True)
    user.user_permissions.set(Permission.objects.filter(content_type__app_label__in=("registry", "policy")))
    TeamMember.objects.create(team=team, user=user, role="admin")
    try:
        with signed_in(browser, url, name, ready="#content-main") as page:
            yield page
    finally:
        user.delete()


def test_two_team_admins_each_see_only_their_own_upstreams_and_get_404_on_the_others(db, console, browser):
    from policy.models import Team
    from registry.models import Upstream

    suffix = uuid.uuid4().hex[:6]
    teams = [Team.objects.create(slug=f"{name}-{suffix}", name=name) for name in ("payments", "support")]
    upstreams = [
        Upstream.objects.create(slug=f"{name}-{suffix}", team=team, transport="stdio", command=name)
        for name, team in zip(("ledger", "helpdesk"), teams, strict=True)
    ]
    try:
        for mine, theirs, team in ((0, 1, teams[0]), (1, 0, teams[1])):
            with team_admin_signed_in(browser, console.url, f"admin-{team.slug}", team) as page:
                page.goto(f"{console.url}/admin/registry/upstream/")
                listed = page.locator("#result_list tbody th a").all_inner_texts()
                assert upstreams[mine].slug in listed and upstreams[theirs].slug not in listed
                response = page.goto(f"{console.url}/admin/registry/upstream/{upstreams[theirs].pk}/change/")
                assert response is not None and response.status == 404
                response = page.goto(f"{console.url}/admin/registry/upstream/{upstreams[mine].pk}/change/")
                assert response is not None and response.status == 200
    finally:
        Upstream.objects.filter(pk__in=[u.pk for u in upstreams]).delete()
        Team.objects.filter(pk__in=[t.pk for t in teams]).delete()


def test_a_borrowing_team_admin_opens_a_shared_upstream_read_only_and_cannot_save_it(db, console, browser):
    from policy.models import Team
    from registry.models import Upstream

    suffix = uuid.uuid4().hex[:6]
    owner, borrower = (Team.objects.create(slug=f"{name}-{suffix}", name=name) for name in ("support", "payments"))
    vault = Upstream.objects.create(slug=f"vault-{suffix}", team=owner, transport="stdio", command="vault-server")
    vault.shared_with.add(borrower)
    change = f"{console.url}/admin/registry/upstream/{vault.pk}/change/"
    try:
        with team_admin_signed_in(browser, console.url, f"admin-{borrower.slug}", borrower) as page:
            page.goto(f"{console.url}/admin/registry/upstream/")
            assert vault.slug in page.locator("#result_list tbody th a").all_inner_texts()
            page.click(f"#result_list a:has-text('{vault.slug}')")
            page.wait_for_selector("#content-main")
            assert page.url == change and page.locator("input[name=_save]").count() == 0
            assert page.locator("text=vault-server").count() == 0  # how it is reached is its owner's
            screenshot(page, "team-borrowed-upstream.png")
            token = page.locator("input[name=csrfmiddlewaretoken]").first.input_value()
            refused = page.request.post(change, form={"csrfmiddlewaretoken": token, "slug": "stolen"})
            assert refused.status == 403 and "CSRF" not in refused.text()  # refused as a borrower, not as a forgery
        vault.refresh_from_db()
        assert vault.slug == f"vault-{suffix}"
    finally:
        Upstream.objects.filter(pk=vault.pk).delete()
        Team.objects.filter(pk__in=[owner.pk, borrower.pk]).delete()
