"""Operators sign in to the console with the external IdP in Chromium; their IdP groups set their role."""

import anyio
import pytest
from django.contrib.auth import get_user_model
from playwright.async_api import async_playwright

from tests import servers
from tests.conftest import needs

pytestmark = pytest.mark.e2e


async def _console_sign_in(gateway_url: str, login: str) -> str:
    """An operator signs in to the console through the IdP's pages in Chromium: the page they end on."""
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
