"""The admin site of the console: the stock admin, with the dashboard as its front page and a sign-in that
offers the IdP (its password form locks as every sign-in does: audit/sign_in.py)."""

from django.conf import settings
from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.urls import path
from django.utils import timezone

from gateway_project.dashboard import REFRESH_SECONDS, WINDOWS, gateway_state, window_stats
from policy.selectors import auditing_teams
from policy.sign_off_views import sign_offs_live, sign_offs_page


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

    def get_urls(self):
        live = path("dashboard/", self.admin_view(self.dashboard_live), name="dashboard_live")
        sign_offs = [
            path("sign-offs/", self.admin_view(sign_offs_page), name="sign_offs"),
            path("sign-offs/live/", self.admin_view(sign_offs_live), name="sign_offs_live"),
        ]
        return [live, *sign_offs, *super().get_urls()]

    def index(self, request: HttpRequest, extra_context: dict | None = None) -> TemplateResponse:
        context = extra_context or {}
        if request.user.has_perm("audit.view_auditevent"):
            context |= self._dashboard(request)
        return super().index(request, context)

    def dashboard_live(self, request: HttpRequest) -> TemplateResponse:
        """The dashboard's figures alone, which its page fetches every REFRESH_SECONDS."""
        if not request.user.has_perm("audit.view_auditevent"):
            raise PermissionDenied
        return TemplateResponse(request, "admin/dashboard_live.html", self._dashboard(request))

    def _dashboard(self, request: HttpRequest) -> dict:
        window = request.GET.get("window", "hour")
        window = window if window in WINDOWS else "hour"
        teams = auditing_teams(user=request.user)
        stats = window_stats(window=window, teams=teams)
        return {
            "window": window,
            "windows": list(WINDOWS),
            "totals": sorted(stats.totals.items()),
            "people": stats.people,
            "chart": stats.chart_data(),
            "state": gateway_state(teams=teams),
            "now": timezone.now(),
            "refresh_seconds": REFRESH_SECONDS,
        }
