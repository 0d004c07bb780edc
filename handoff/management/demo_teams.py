"""The demo's two teams (docs/teams.md), set up by setup_demo after its upstreams: the default team is the
platform team, owning the demo's upstreams (`time`, `demo`) and agents (`demo`, `people`); `payments` owns the
finance specialist and an agent of its own. Each shares one upstream with the other: `demo` with payments, and
`finance` with the default team, whose route hands off to it. Each team has an admin console account that sees
and changes only its team's objects. Run again, it changes nothing and shows no password again."""

from dataclasses import dataclass

from django.contrib.auth import get_user_model

from audit.models import DEFAULT_TEAM
from handoff.management.demo_passwords import Passwords
from policy.console_groups import team_role_group
from policy.models import Team, TeamMember, TeamRole
from policy.services import policy_object_save, relations_record
from registry.models import Upstream
from registry.services import upstream_save

ACTOR = "setup_demo"
PAYMENTS = "payments"
PAYMENTS_AGENT = "payments-bot"
SHARED = (("demo", DEFAULT_TEAM, PAYMENTS), ("finance", PAYMENTS, DEFAULT_TEAM))  # upstream, owner, borrower
TEAM_ADMINS = {DEFAULT_TEAM: "platform-admin", PAYMENTS: "payments-admin"}
ABOUT = """
Two teams (docs/teams.md); the gateway admin above manages both, each team's admin only its own:
  {default}   the platform: upstreams time and demo (demo shared with payments), agents demo and people;
            console admin {default_admin}
  {payments}  upstream finance (shared with {default}, whose route hands off to it), agent {agent};
            console admin {payments_admin}
"""


@dataclass(frozen=True)
class DemoTeams:
    payments: Team
    logins: dict[str, str]  # team slug -> "login / password" when made now, else "login"

    def about(self) -> str:
        fields = {"default_admin": self.logins[DEFAULT_TEAM], "payments_admin": self.logins[PAYMENTS]}
        return ABOUT.format(default=DEFAULT_TEAM, payments=PAYMENTS, agent=PAYMENTS_AGENT, **fields)


def demo_teams_setup(passwords: Passwords) -> DemoTeams:
    """The payments team, the demo's upstreams given and shared as above, and each team's console admin (made with
    its password in `passwords` if it has one there)."""
    payments = Team.objects.filter(slug=PAYMENTS).first()
    if payments is None:
        payments = Team(slug=PAYMENTS, name="Payments")
        policy_object_save(obj=payments, actor=ACTOR, created=True)
    teams = {team.slug: team for team in Team.objects.filter(slug__in=(DEFAULT_TEAM, PAYMENTS))}
    for slug, owner, borrower in SHARED:
        upstream = Upstream.objects.filter(slug=slug).first()
        if upstream is not None:
            _share(upstream, owner=teams[owner], borrower=teams[borrower])
    logins = {slug: _team_admin(teams[slug], login, passwords) for slug, login in TEAM_ADMINS.items()}
    return DemoTeams(payments, logins)


def _share(upstream: Upstream, *, owner: Team, borrower: Team) -> None:
    if upstream.team_id != owner.pk:
        upstream.team = owner
        upstream_save(upstream=upstream, actor=ACTOR)
    if not upstream.shared_with.filter(pk=borrower.pk).exists():
        upstream.shared_with.add(borrower)
        shared = list(upstream.shared_with.values_list("slug", flat=True))
        relations_record(obj=upstream, actor=ACTOR, action="upstream_shared", shared_with=shared)


def team_admins_missing() -> list[str]:
    """The logins of the teams' console admins not made yet."""
    made = set(get_user_model().objects.filter(username__in=TEAM_ADMINS.values()).values_list("username", flat=True))
    return [login for login in TEAM_ADMINS.values() if login not in made]


def _team_admin(team: Team, login: str, passwords: Passwords) -> str:
    """The team's console admin, "login / password" when made now, else its login alone."""
    if login not in passwords:
        return login
    user, password = passwords.user_create(login, is_staff=True)
    user.groups.set([team_role_group(TeamRole.ADMIN)])  # the models' permissions; the team role cuts them down
    TeamMember.objects.create(team=team, user=user, role=TeamRole.ADMIN)
    members = [f"{m.user.get_username()}: {m.role}" for m in team.members.select_related("user")]
    relations_record(obj=team, actor=ACTOR, action="team_members", members=members)
    return f"{login} / {password}"
