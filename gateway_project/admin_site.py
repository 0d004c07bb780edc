"""The admin site of the console: the stock admin, with the dashboard as its front page and a sign-in that
offers the IdP (its password form locks as every sign-in does: audit/sign_in.py)."""

from django.conf import settings
from django.contrib import admin
from django.http import HttpRequest
from django.template.response import TemplateResponse

from gateway_project.dashboard import WINDOWS, gateway_state, window_stats


class ConsoleSite(admin.AdminSite):
    site_header = site_title = "Switchboard"
    index_title = "Gateway health"
    index_template = "admin/console_index.html"
    login_template = "admin/console_login.html"

    def login(self, request: HttpRequest, extra_context: dict | None = None):
        """The stock sign-in, with a way to the IdP when console sign-in with it is on (and the password form
        only while local passwords are)."""
        sso = {"console_sso": settings.CONSOLE_SSO, "console_passwords": settings.GATEWAY_CONSOLE_PASSWORDS}
        return super().login(request, (extra_context or {}) | sso)

    def index(self, request: HttpRequest, extra_context: dict | None = None) -> TemplateResponse:
        context = extra_context or {}
        if request.user.has_perm("audit.view_auditevent"):
            window = request.GET.get("window", "hour")
            window = window if window in WINDOWS else "hour"
            stats = window_stats(window=window)
            context |= {
                "window": window,
                "windows": list(WINDOWS),
                "totals": sorted(stats.totals.items()),
                "people": stats.people,
                "chart": stats.chart_data(),
                "state": gateway_state(),
            }
        return super().index(request, context)
