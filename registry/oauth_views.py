"""My account: Connections, for an upstream a person connects by signing in at its own authorization server.

The web process only sends the browser there and back: the executor finds the server, registers the gateway,
holds the PKCE verifier (sealed in the attempt's material, which this process cannot open), exchanges the code
and stores the credential. This process sees the authorization code alone, and seals it before handing it on.
"""

import re
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from registry.connect_attempts import EXPIRED, SOMEONE_ELSE, AttemptRefused, connect_attempt_open, connect_attempt_take
from registry.connection_views import gateway_url, people_of, person_for
from registry.credentials import credential_seal
from registry.executor import get_executor
from registry.models import ConnectAttempt, Upstream
from registry.upstreams.upstream_oauth import client_document, code_name

ERROR_CODE = re.compile(r"[a-z0-9_]{1,64}\Z")  # an AS's `error` shown as is only when it looks like one (RFC 6749)


def callback_url(request: HttpRequest) -> str:
    return f"{gateway_url(request)}{reverse('connection-callback')}"


def authorization_url(begun: dict, state: str, redirect_uri: str) -> str:
    """The authorization request (code, PKCE S256, RFC 8707 resource), added to the endpoint's own query."""
    params = {
        "response_type": "code",
        "client_id": begun["client_id"],
        "redirect_uri": redirect_uri,
        "state": state,
        "code_challenge": begun["code_challenge"],
        "code_challenge_method": "S256",
        "resource": begun["resource"],
    }
    params |= {name: begun[name] for name in ("scope", "prompt") if begun.get(name)}
    endpoint = urlsplit(begun["authorization_endpoint"])
    return urlunsplit(endpoint._replace(query=urlencode([*parse_qsl(endpoint.query), *params.items()])))


def _ended(request: HttpRequest, upstream: Upstream | None, message: str, status: int) -> HttpResponse:
    context = {"upstream": upstream, "message": message}
    return render(request, "account/connection_ended.html", context, status=status)


def _someone_else(request: HttpRequest, upstream: Upstream) -> HttpResponse:
    context = {"upstream": upstream, "people": people_of(request)}
    return render(request, "account/connection_refused.html", context, status=403)


@login_required
@require_POST
def connection_oauth(request: HttpRequest, slug: str) -> HttpResponse:
    """Begin: the executor finds where to sign in; the browser goes there with a fresh state."""
    upstream = get_object_or_404(
        Upstream, slug=slug, per_person=True, enabled=True, person_connect=Upstream.PersonConnect.OAUTH
    )
    person = person_for(request, slug)
    if person is None:
        return _someone_else(request, upstream)
    redirect_uri = callback_url(request)
    outcome = get_executor().oauth_begin(upstream_id=upstream.id, redirect_uri=redirect_uri)
    if not outcome["ok"]:
        return _ended(request, upstream, outcome["message"], status=502)
    begun = outcome["result"]
    if urlsplit(begun["authorization_endpoint"]).scheme not in ("https", "http"):
        return _ended(request, upstream, f"{slug}'s sign-in page is not a web address.", status=502)
    material = begun["material"] | {"for": request.POST.get("for", "")}
    state = connect_attempt_open(upstream=upstream, person=person, material=material)
    return redirect(authorization_url(begun, state, redirect_uri))


def _refused(request: HttpRequest, refused: AttemptRefused) -> HttpResponse:
    if refused.reason == SOMEONE_ELSE:
        return _someone_else(request, refused.upstream)
    if refused.reason == EXPIRED:
        message = "This sign-in took too long and has expired: nothing was connected. Start again."
    else:
        message = "This sign-in is unknown or was finished already: nothing more was connected. Start again."
    return _ended(request, None, message, status=400)


def _declined(upstream: Upstream, error: str) -> str:
    if error == "access_denied":
        return f"You declined at {upstream.slug}: nothing was connected."
    said = error if ERROR_CODE.match(error) else "an error"
    return f"{upstream.slug}'s sign-in ended with {said}: nothing was connected. Start again."


def _issuer_problem(request: HttpRequest, material: dict) -> str:
    """RFC 9207: an answer naming another server than the one the person was sent to is a mix-up, refused."""
    iss = request.GET.get("iss")
    if iss is None and material.get("iss_required"):
        return "The sign-in's answer does not say which server sent it, as that server promised to: start again."
    if iss is not None and iss != material.get("issuer"):
        return "The sign-in's answer came from another server than the one you were sent to: start again."
    return ""


def _connected(attempt: ConnectAttempt) -> HttpResponse:
    made_for = attempt.material.get("for", "")
    query = urlencode({"connected": 1} | ({"for": made_for} if made_for else {}))
    return redirect(f"{reverse('connection', args=[attempt.upstream.slug])}?{query}")


@login_required
@require_GET
def connection_callback(request: HttpRequest) -> HttpResponse:
    """The authorization server sends the browser back here: the attempt is taken once, by its own person, and the
    code goes, sealed, to the executor."""
    people = {person[:2] for person in people_of(request)}
    try:
        attempt = connect_attempt_take(state=request.GET.get("state", ""), people=people)
    except AttemptRefused as refused:
        return _refused(request, refused)
    upstream = attempt.upstream
    if error := request.GET.get("error"):
        return _ended(request, upstream, _declined(upstream, error), status=400)
    if problem := _issuer_problem(request, attempt.material):
        return _ended(request, upstream, problem, status=400)
    code = request.GET.get("code", "")
    if not code:
        return _ended(request, upstream, "The sign-in's answer carries no code: start again.", status=400)
    outcome = get_executor().oauth_finish(
        upstream_id=upstream.id,
        material=attempt.material,
        sealed_code=credential_seal(code, name=code_name(upstream.id)),
        redirect_uri=callback_url(request),
        person_issuer=attempt.person_issuer,
        person_subject=attempt.person_subject,
        person_name=attempt.person_name,
    )
    if not outcome["ok"]:
        return _ended(request, upstream, outcome["message"], status=502)
    return _connected(attempt)


@require_GET
def connection_client(request: HttpRequest) -> JsonResponse:
    """The gateway's Client ID Metadata Document, for authorization servers that take one (its URL: the client_id)."""
    return JsonResponse(client_document(callback_url(request)))
