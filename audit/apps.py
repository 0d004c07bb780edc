from django.apps import AppConfig
from django.contrib.admin import apps as admin_apps
from django.contrib.staticfiles.apps import StaticFilesConfig

# Chart.js's package, but for the one build the dashboard loads (chart.umd.min.js and its source map).
CHART_JS_UNUSED = ["chart.cjs*", "chart.js*", "chart.umd.js*", "helpers*", "*.d.ts", "chunks", "controllers", "core"]
CHART_JS_UNUSED += ["elements", "platform", "plugins", "scales", "types"]


class AuditConfig(AppConfig):
    default = True
    name = "audit"
    verbose_name = "Audit trail"


class ConsoleAdminConfig(admin_apps.AdminConfig):
    """django.contrib.admin, on the console's site (gateway_project/admin_site.py)."""

    default = False
    default_site = "gateway_project.admin_site.ConsoleSite"


class ConsoleStaticFilesConfig(StaticFilesConfig):
    """django.contrib.staticfiles, gathering only what the console serves: collectstatic hashes and compresses
    every file it gathers (minutes for Chart.js's whole package), and the REST API renders JSON only, so DRF's
    browsable-API assets are never asked for."""

    ignore_patterns = [*StaticFilesConfig.ignore_patterns, "rest_framework/*", *CHART_JS_UNUSED]
