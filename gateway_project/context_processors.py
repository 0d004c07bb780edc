"""What every page's template may show, whichever view renders it: the console's footer names the version."""

from django.http import HttpRequest

from gateway_project import __version__


def version(request: HttpRequest) -> dict[str, str]:
    return {"switchboard_version": __version__}
