"""My account: a signed-in person makes and revokes their own API keys, and sees and revokes the OAuth clients
they allowed. A personal key acts as the agent of the built-in authorization server's people
(GATEWAY_AUTH_SERVER_AGENT) and its calls are audited as its owner."""

import json
from datetime import timedelta

from django import forms
from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_http_methods

from policy.models import Agent, AgentKey, SignOff
from policy.selectors import oauth_clients_allowed
from policy.services import agent_key_issue, agent_key_revoke, oauth_client_revoke
from policy.sign_off import SignOffRefused, approver_refusal, sign_off_decide

LIFETIMES = [(7, "7 days"), (30, "30 days"), (90, "90 days"), (365, "a year")]


class PersonalKeyForm(forms.Form):
    label = forms.CharField(max_length=64, required=False)
    days = forms.TypedChoiceField(choices=LIFETIMES, coerce=int, initial=30, label="Expires in")
    tools = forms.CharField(
        max_length=512, required=False, help_text="Only these tools (space-separated, * as a wildcard); empty: all"
    )


@login_required
@require_http_methods(["GET", "POST"])
def my_account(request: HttpRequest) -> HttpResponse:
    agent = Agent.objects.filter(name=settings.GATEWAY_AUTH_SERVER_AGENT, enabled=True).first()
    actor = request.user.get_username()
    made, form = None, PersonalKeyForm()
    if request.method == "POST" and (revoking := request.POST.get("revoke")):
        if AgentKey.objects.filter(prefix=revoking, owner=request.user).exists():
            agent_key_revoke(prefix=revoking, actor=actor)
        return redirect("my-account")
    if request.method == "POST" and (client_id := request.POST.get("revoke_client")):
        if any(client.client_id == client_id for client in oauth_clients_allowed(user=request.user)):
            oauth_client_revoke(user=request.user, client_id=client_id, actor=actor)
        return redirect("my-account")
    if request.method == "POST" and agent is not None:
        form = PersonalKeyForm(request.POST)
        if form.is_valid():
            expires_at = timezone.now() + timedelta(days=form.cleaned_data["days"])
            terms = {"owner": request.user, "tools": form.cleaned_data["tools"].strip(), "expires_at": expires_at}
            made = agent_key_issue(agent=agent, label=form.cleaned_data["label"], actor=actor, **terms).key
            form = PersonalKeyForm()
    keys = AgentKey.objects.filter(owner=request.user).order_by("-created_at")
    clients = oauth_clients_allowed(user=request.user)
    context = {"agent": agent, "form": form, "keys": keys, "made": made, "now": timezone.now(), "clients": clients}
    return render(request, "account/my_account.html", context)


@login_required
@require_http_methods(["GET", "POST"])
def my_sign_off(request: HttpRequest, ident: str) -> HttpResponse:
    """A call the signed-in person may sign off (their own, where the rule names no group; or as an approver):
    the link a refusal for sign-off carries, and a URL elicitation opens."""
    found = SignOff.objects.select_related("agent", "team", "signers").filter(pk=ident).first()
    refusal = approver_refusal(request.user, found) if found is not None else None
    if found is None or (refusal is not None and refusal.status == 404):
        raise Http404("No such sign-off request.")
    error = str(refusal) if refusal is not None else ""
    if request.method == "POST" and refusal is None:
        grant = request.POST.get("decision") == "grant"
        try:
            found = sign_off_decide(
                sign_off_id=ident, user=request.user, grant=grant, reason=request.POST.get("reason", "")
            )
        except SignOffRefused as refused:
            error = str(refused)
    arguments = json.dumps(found.arguments, indent=2, ensure_ascii=False) if found.arguments is not None else None
    status = 403 if refusal is not None else 400 if error else 200
    may = refusal is None
    context = {"sign_off": found, "arguments": arguments if may else None, "error": error, "may": may}
    return render(request, "account/sign_off.html", context, status=status)
