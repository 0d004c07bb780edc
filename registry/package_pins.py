"""npx and uvx upstreams' packages, pinned and held (registry/upstreams/packages/ installs them).

A command line with no pin yet is installed and pinned when its upstream is synced: registering the upstream, or
changing its command, is the operator's own approval of what it names. Installing it again later
(`manage.py upstream_package <slug> --update`, or the console's action) pins nothing by itself: a package that came
back different (another version, or the same one with other contents) is held, and the pinned one runs until an
administrator approves the held one. Each step is an audit row naming the package, its version and integrity."""

from typing import Any

from django.db import transaction

from audit.services import audit_record
from policy.models import team_slug_of
from registry.models import Upstream
from registry.upstreams.packages import PackageProblem, asked, install


def package_summary(pin: dict[str, Any]) -> dict[str, str]:
    """What a pin is, for the audit and the console: never the lock itself."""
    return {key: pin[key] for key in ("name", "version", "integrity", "digest")}


def _asked(upstream: Upstream):
    return asked(upstream.command, list(upstream.args)) if upstream.transport == "stdio" else None


def _store(upstream: Upstream, package: dict[str, Any], actor: str, detail: dict[str, Any], *, runs: bool) -> None:
    """Stores the package state; one that changes what runs bumps the revision, so executors start it anew."""
    upstream.package = package
    with transaction.atomic():
        if runs:
            upstream.revision += 1
        upstream.save(update_fields=["package", "revision", "updated_at"])
        audit_record(
            kind="admin_change", actor=actor, upstream=upstream.slug, team=team_slug_of(upstream), detail=detail
        )


def package_pin(*, upstream: Upstream, actor: str) -> str:
    """Installs and pins what an npx or uvx upstream's command line asks for when it has no pin for that line; ""
    when there is nothing to do or it is done, else why it could not be."""
    try:
        wanted = _asked(upstream)
    except PackageProblem as exc:
        return str(exc)
    line = [upstream.command, *upstream.args]
    if wanted is None or upstream.package.get("pinned", {}).get("asked") == line:
        return ""
    try:
        pin = install(upstream.slug, wanted) | {"asked": line}
    except PackageProblem as exc:
        return f"package not installed: {exc}"
    _store(upstream, {"pinned": pin}, actor, {"action": "package_pinned", **package_summary(pin)}, runs=True)
    return ""


def _pinned(upstream: Upstream) -> dict[str, Any]:
    if not (pinned := upstream.package.get("pinned")):
        raise PackageProblem(f"upstream {upstream.slug} runs no pinned package (npx, uvx)")
    return pinned


def package_update(*, upstream: Upstream, actor: str) -> str:
    """Installs the upstream's package again; one that came back different is held. Says which."""
    pinned = _pinned(upstream)
    wanted = _asked(upstream)
    if wanted is None or pinned["asked"] != [upstream.command, *upstream.args]:
        raise PackageProblem(f"upstream {upstream.slug}'s command changed since its package was pinned: sync it")
    fresh = install(upstream.slug, wanted) | {"asked": pinned["asked"]}
    before, after = package_summary(pinned), package_summary(fresh)
    if fresh["digest"] == pinned["digest"]:
        return f"unchanged: {pinned['name']} {pinned['version']}"
    detail = {"action": "package_held", "before": before, "after": after}
    _store(upstream, {"pinned": pinned, "held": fresh}, actor, detail, runs=False)
    return f"held for approval: {pinned['name']} {pinned['version']} -> {fresh['version']} ({fresh['integrity']})"


def package_approve(*, upstream: Upstream, actor: str) -> str:
    """The held package becomes the pinned one, and runs from the next start."""
    pinned = _pinned(upstream)
    if not (held := upstream.package.get("held")):
        raise PackageProblem(f"upstream {upstream.slug} has no package held for approval")
    detail = {"action": "package_approved", "before": package_summary(pinned), "after": package_summary(held)}
    _store(upstream, {"pinned": held}, actor, detail, runs=True)
    return f"approved: {held['name']} {held['version']}"
