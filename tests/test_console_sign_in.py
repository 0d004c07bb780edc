"""Operators sign in to the console with the external IdP in Chromium; their IdP groups set their role, and their
team roles through the team group mappings."""

import anyio
import pytest
from django.contrib.auth import get_user_model
from playwright.async_api import async_playwright

from policy.selectors import user_team_roles
from policy.services import TeamRefused, team_group_map
from registry.models import Upstream
from tests import servers
from tests.conftest import needs
from tests.factories import team

pytestmark = pytest.mark.e2e


async def _console_sign_in(gateway_url: str, login: str, then: str = "") -> str:
    """An operator signs in to the console through the IdP's pages in Chromium: the page they end on (or, signed
    in, the console's page `then`)."""
    needs(servers.CHROMIUM.exists(), "Chromium is not installed (apt-get install chromium)")
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=str(servers.CHROMIUM), args=servers.CHROMIUM_ARGS)
        try:
            page = await browser.new_page()
            page.set_default_timeout(10_000)
            await page.goto(f"{gateway_url}/admin/login/?next=/admin/")
            await page.click("#sign-in-with-idp")
            await page.fill("input[name=login]", login)
            await page.fill("input[name=password]", "any")
            await page.click("button[type=submit]")
            await page.click("button[type=submit]")  # the IdP's consent
            await page.wait_for_url(f"{gateway_url}/admin/**")
            if then:
                await page.goto(f"{gateway_url}{then}")
            return page.url + "\n" + await page.content()
        finally:
            await browser.close()


@pytest.mark.parametrize(
    ("login", "superuser", "groups"),
    [("admin-olga", True, set()), ("auditor-ravi", False, {"Auditor", "Reader"}), ("reader-sam", False, {"Reader"})],
)
def test_operators_sign_in_to_the_console_with_the_idp_and_their_groups_set_their_role(
    idp_gateway, login, superuser, groups
):
    idp, gateway = idp_gateway
    ended = anyio.run(_console_sign_in, gateway.url, login)
    assert "Gateway health" in ended  # the console's front page, signed in
    user = get_user_model().objects.get(username=f"{login}@127.0.0.1")
    try:
        assert (user.is_staff, user.is_superuser, user.has_usable_password()) == (True, superuser, False)
        assert {group.name for group in user.groups.all()} == groups
        assert (user.first_name, user.last_name, user.email) == ("Person", login, f"{login}@example.test")
    finally:
        user.delete()


def test_someone_in_none_of_the_consoles_groups_is_not_let_in(idp_gateway):
    idp, gateway = idp_gateway
    ended = anyio.run(_console_sign_in, gateway.url, "engineer-eve")
    assert "/admin/login/?sso=refused" in ended.splitlines()[0]
    assert "you are in none of the console" in ended
    assert not get_user_model().objects.filter(username="engineer-eve@127.0.0.1").exists()


def test_an_idp_group_mapped_to_a_team_gives_its_role_at_sign_in_until_the_idp_takes_it_away(idp_gateway):
    idp, gateway = idp_gateway
    with team("signin-a") as a, team("signin-b") as b:
        for owner in (a, b):
            Upstream.objects.create(slug=f"{owner.slug}-tools", transport="stdio", command="true", team=owner)
        team_group_map(group="okta-signin-a", team="signin-a", role="admin", actor="tests")
        with pytest.raises(TeamRefused, match="No team .signin-c.: create the team first"):
            team_group_map(group="okta-signin-a", team="signin-c", role="admin", actor="tests")
        idp.give_groups("engineer-tia", ["engineers", "okta-signin-a"])
        listed = anyio.run(_console_sign_in, gateway.url, "engineer-tia", "/admin/registry/upstream/")
        user = get_user_model().objects.get(username="engineer-tia@127.0.0.1")
        try:
            assert "signin-a-tools" in listed and "signin-b-tools" not in listed
            assert (user.is_staff, user.is_superuser) == (True, False)
            assert {group.name for group in user.groups.all()} == {"Team admin"}
            assert user_team_roles(user=user) == {"signin-a": "admin"}
            idp.give_groups("engineer-tia", ["engineers"])  # removed from the group at the IdP
            ended = anyio.run(_console_sign_in, gateway.url, "engineer-tia")
            assert "/admin/login/?sso=refused" in ended.splitlines()[0]
            assert user_team_roles(user=user) == {}
        finally:
            user.delete()
