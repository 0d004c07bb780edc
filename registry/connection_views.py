"""My account: Connections. A person connects their own account at each per-person upstream (a personal token
they paste, sealed at once; or the upstream's own OAuth sign-in, registry/oauth_views.py), sees what they have
connected and until when, and disconnects. No page ever shows a value."""

from django import forms
from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils.http import urlencode
from django.views.decorators.http import require_http_methods, require_POST

from policy.identity import person_digest
from policy.models import Person
from registry.models import PersonalCredential, Upstream
from registry.personal import connect_link_person, personal_connect, personal_disconnect
from registry.secret_store import SecretStoreUnavailable

MAX_TOKEN_CHARS = 8192


class TokenForm(forms.Form):
    token = forms.CharField(
        max_length=MAX_TOKEN_CHARS,
        strip=True,
        widget=forms.PasswordInput(attrs={"autocomplete": "off"}, render_value=False),
        help_text="Sealed as soon as it arrives; only the gateway's workers can open it. Nobody can see it again.",
    )

    def clean_token(self) -> str:
        token = self.cleaned_data["token"]
        if any(not char.isprintable() or char.isspace() for char in token):
            raise forms.ValidationError("A token is one line of visible characters, without spaces.")
        return token


def gateway_url(request: HttpRequest) -> str:
    """The gateway's public URL, as the MCP side names it (handoff/mcp/caller.py public_base)."""
    return settings.GATEWAY_PUBLIC_URL.rstrip("/") or f"{request.scheme}://{request.get_host()}"


def people_of(request: HttpRequest) -> list[tuple[str, str, str]]:
    """Who the signed-in account acts as toward upstreams (issuer, subject, name): itself, as the built-in
    authorization server and personal keys name it, then the IdP people who signed in as it, newest first."""
    user = request.user
    name = user.get_full_name() or user.get_username()
    own = [(gateway_url(request), str(user.pk), name)]
    linked = Person.objects.filter(user=user).order_by("-last_seen")
    return [(p.issuer, p.subject, p.name or name) for p in linked] + own


def person_for(request: HttpRequest, slug: str) -> tuple[str, str, str] | None:
    """The person a connection is made for: the one a connect link names (None if it names someone the account
    is not), else the account's IdP person, else the account itself."""
    people = people_of(request)
    made_for = request.GET.get("for") or request.POST.get("for")
    if not made_for:
        return people[0]
    digest = connect_link_person(slug, made_for)
    return next((p for p in people if person_digest(p[0], p[1]) == digest), None)


@login_required
def connections(request: HttpRequest) -> HttpResponse:
    people = people_of(request)
    mine = PersonalCredential.objects.select_related("upstream").filter(
        person_issuer__in={p[0] for p in people}, person_subject__in={p[1] for p in people}
    )
    connected = {c.upstream_id: c for c in mine if (c.person_issuer, c.person_subject) in {p[:2] for p in people}}
    upstreams = Upstream.objects.filter(per_person=True, enabled=True).order_by("slug")
    rows = [(upstream, connected.get(upstream.id)) for upstream in upstreams]
    return render(request, "account/connections.html", {"rows": rows})


def _other_person(request: HttpRequest, upstream: Upstream) -> HttpResponse:
    context = {"upstream": upstream, "people": people_of(request)}
    return render(request, "account/connection_refused.html", context, status=403)


@login_required
@require_http_methods(["GET", "POST"])
def connection(request: HttpRequest, slug: str) -> HttpResponse:
    upstream = get_object_or_404(Upstream, slug=slug, per_person=True, enabled=True)
    person = person_for(request, slug)
    if person is None:
        return _other_person(request, upstream)
    made_for = request.GET.get("for") or request.POST.get("for") or ""
    form = TokenForm()
    if request.method == "POST" and upstream.person_connect == Upstream.PersonConnect.TOKEN:
        form = TokenForm(request.POST)
        if form.is_valid():
            issuer, subject, name = person
            values = {"token": form.cleaned_data["token"]}
            kind = PersonalCredential.Kind.TOKEN
            try:
                personal_connect(upstream=upstream, issuer=issuer, subject=subject, name=name, kind=kind, values=values)
            except SecretStoreUnavailable:
                form.add_error(None, "The credential store cannot be reached now: nothing was stored. Try again soon.")
            else:  # the link's `for` kept: the page then names the person just connected (as the OAuth way does)
                query = urlencode({"connected": 1} | ({"for": made_for} if made_for else {}))
                return redirect(f"{request.path}?{query}")
    credential = PersonalCredential.objects.filter(
        upstream=upstream, person_issuer=person[0], person_subject=person[1]
    ).first()
    context = {
        "upstream": upstream,
        "person": person,
        "credential": credential,
        "form": form,
        "made_for": made_for,
        # Said from the row, not the address alone: a bookmarked ?connected=1 must not hide a revoke.
        "connected": request.GET.get("connected") == "1" and _usable(credential),
    }
    return render(request, "account/connection.html", context)


def _usable(credential: PersonalCredential | None) -> bool:
    return credential is not None and not credential.revoked_at and not credential.refresh_failed_at


@login_required
@require_POST
def connection_disconnect(request: HttpRequest, slug: str) -> HttpResponse:
    people = {p[:2] for p in people_of(request)}
    for credential in PersonalCredential.objects.filter(upstream__slug=slug).select_related("upstream"):
        if (credential.person_issuer, credential.person_subject) in people:
            personal_disconnect(credential)
    return redirect("connections")
