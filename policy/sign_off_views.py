"""The approver's console queue (docs/policy.md, "Sign-off"): the pending requests the signed-in account may decide,
each with the arguments as the upstream will receive them, and its decision. The page's script fetches the list
again every few seconds (`sign_offs_live`); without the script a reload shows the current list."""

import json
from dataclasses import dataclass

from django import forms
from django.contrib import admin, messages
from django.contrib.auth.models import AbstractBaseUser
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone

from policy.models import SignOff
from policy.sign_off import REASON_CHARS, SignOffRefused, sign_off_decide, sign_offs_for

REFRESH_SECONDS = 3


class DecisionForm(forms.Form):
    sign_off = forms.CharField(max_length=64)
    decision = forms.ChoiceField(choices=[("grant", "Sign off"), ("refuse", "Refuse")])
    reason = forms.CharField(max_length=REASON_CHARS, required=False)


@dataclass(frozen=True)
class Entry:
    """A request as the queue shows it: its arguments as indented JSON (the template escapes them: they are the
    caller's text), and whether the account may open the rule that asked."""

    request: SignOff
    arguments: str
    rule_link: bool


def _entries(user: AbstractBaseUser) -> list[Entry]:
    rule_link = user.has_perm("policy.view_rule")
    return [
        Entry(sign_off, json.dumps(sign_off.arguments, indent=2, ensure_ascii=False), rule_link)
        for sign_off in sign_offs_for(user)
    ]


def _context(request: HttpRequest) -> dict:
    return {"entries": _entries(request.user), "now": timezone.now(), "refresh_seconds": REFRESH_SECONDS}


def sign_offs_page(request: HttpRequest) -> HttpResponse:
    """The queue (GET), or one decision (POST), after which the queue is shown again with what happened."""
    if request.method == "POST":
        _decide(request)
        return HttpResponseRedirect(reverse("admin:sign_offs"))
    context = admin.site.each_context(request) | {"title": "Sign-off requests"} | _context(request)
    return TemplateResponse(request, "admin/sign_offs.html", context)


def sign_offs_live(request: HttpRequest) -> HttpResponse:
    """The list alone, which the page fetches every REFRESH_SECONDS."""
    return TemplateResponse(request, "admin/sign_offs_live.html", _context(request))


def _decide(request: HttpRequest) -> None:
    form = DecisionForm(request.POST)
    if not form.is_valid():
        errors = "; ".join(f"{name}: {' '.join(found)}" for name, found in form.errors.items())
        messages.error(request, f"This decision was not understood ({errors}).")
        return
    asked, grant = form.cleaned_data, form.cleaned_data["decision"] == "grant"
    try:
        decided = sign_off_decide(sign_off_id=asked["sign_off"], user=request.user, grant=grant, reason=asked["reason"])
    except SignOffRefused as refused:
        messages.error(request, str(refused))
        return
    who = decided.person_name or decided.person_subject or decided.agent.name
    if grant:
        messages.success(request, f"Signed off {decided.exposed_name} for {who}: its next identical call runs.")
    else:
        messages.success(request, f"Refused {decided.exposed_name} for {who}: the caller is told why.")
