import django.db.models.deletion
import policy.models
from django.conf import settings
from django.db import migrations, models


DEFAULT_TEAM = "default"  # audit.models.DEFAULT_TEAM, as it was when this migration was written
OWNED = ("Agent", "AgentGroup", "Rule", "ServerGroup")
# Console groups as they stand before teams (audit/migrations/0004, policy/console_sign_in.py): their members read.
READING_GROUPS = ("Auditor", "Reader")


def _role(user, permission, db: str) -> str:
    """An operator's default-team role from what they may do now: one who may add, change or delete anything
    manages (admin); one who reads, as the Auditor and Reader groups do, audits; anyone else calls (member)."""
    mine = permission.objects.using(db).filter(models.Q(user=user) | models.Q(group__user=user))
    if mine.filter(codename__regex=r"^(add|change|delete)_").exists():
        return "admin"
    if user.groups.filter(name__in=READING_GROUPS).exists() or mine.exists():
        return "auditor"
    return "member"


def default_team(apps, schema_editor) -> None:
    """Everything that exists belongs to the default team; superusers are gateway admins (nothing stored);
    every other staff account gets a default-team role by its current groups and permissions."""
    db = schema_editor.connection.alias
    teams = apps.get_model("policy", "Team").objects.using(db)
    team, _ = teams.get_or_create(slug=DEFAULT_TEAM, defaults={"name": "Default"})
    for name in OWNED:
        apps.get_model("policy", name).objects.using(db).filter(team__isnull=True).update(team=team)
    user_model = apps.get_model(*settings.AUTH_USER_MODEL.split("."))
    permission = apps.get_model("auth", "Permission")
    members = apps.get_model("policy", "TeamMember").objects.using(db)
    for user in user_model.objects.using(db).filter(is_staff=True, is_superuser=False):
        members.get_or_create(team=team, user=user, defaults={"role": _role(user, permission, db)})


class Migration(migrations.Migration):

    dependencies = [
        ('policy', '0009_person_account'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
        ("auth", "0012_alter_user_first_name_max_length"),
    ]

    operations = [
        migrations.CreateModel(
            name='Team',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('slug', models.SlugField(help_text='How audit rows and the API name the team', max_length=32, unique=True)),
                ('name', models.CharField(max_length=64, unique=True, validators=[policy.models.visible_name])),
                ('created_at', models.DateTimeField(auto_now_add=True)),
            ],
            options={
                'ordering': ['slug'],
            },
        ),
        migrations.CreateModel(
            name='TeamGroup',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('group', models.CharField(help_text="The group's name, exactly", max_length=150, validators=[policy.models.visible_name])),
                ('role', models.CharField(choices=[('admin', "Admin: manages the team's objects and members"), ('member', "Member: calls the team's tools"), ('auditor', "Auditor: reads the team's audit trail")], max_length=8)),
                ('team', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='idp_groups', to='policy.team')),
            ],
            options={
                'verbose_name': 'team group mapping',
                'ordering': ['group', 'team__slug'],
                'constraints': [models.UniqueConstraint(fields=('group', 'team'), name='team_group_once')],
            },
        ),
        migrations.CreateModel(
            name='TeamMember',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('role', models.CharField(choices=[('admin', "Admin: manages the team's objects and members"), ('member', "Member: calls the team's tools"), ('auditor', "Auditor: reads the team's audit trail")], max_length=8)),
                ('team', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='members', to='policy.team')),
                ('user', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='team_memberships', to=settings.AUTH_USER_MODEL)),
            ],
            options={
                'ordering': ['team__slug', 'user__username'],
                'constraints': [models.UniqueConstraint(fields=('team', 'user'), name='team_member_once')],
            },
        ),
        migrations.AddField(
            model_name='agent',
            name='team',
            field=models.ForeignKey(null=True, on_delete=django.db.models.deletion.PROTECT, related_name='agents', to='policy.team'),
        ),
        migrations.AddField(
            model_name='agentgroup',
            name='team',
            field=models.ForeignKey(null=True, on_delete=django.db.models.deletion.PROTECT, related_name='agent_groups', to='policy.team'),
        ),
        migrations.AddField(
            model_name='rule',
            name='team',
            field=models.ForeignKey(null=True, on_delete=django.db.models.deletion.PROTECT, related_name='rules', to='policy.team'),
        ),
        migrations.AddField(
            model_name='servergroup',
            name='team',
            field=models.ForeignKey(null=True, on_delete=django.db.models.deletion.PROTECT, related_name='server_groups', to='policy.team'),
        ),
        migrations.RunPython(default_team, migrations.RunPython.noop),
        migrations.AlterField(
            model_name='agent',
            name='team',
            field=models.ForeignKey(default=policy.models.default_team, on_delete=django.db.models.deletion.PROTECT, related_name='agents', to='policy.team'),
        ),
        migrations.AlterField(
            model_name='agentgroup',
            name='team',
            field=models.ForeignKey(default=policy.models.default_team, on_delete=django.db.models.deletion.PROTECT, related_name='agent_groups', to='policy.team'),
        ),
        migrations.AlterField(
            model_name='rule',
            name='team',
            field=models.ForeignKey(default=policy.models.default_team, on_delete=django.db.models.deletion.PROTECT, related_name='rules', to='policy.team'),
        ),
        migrations.AlterField(
            model_name='servergroup',
            name='team',
            field=models.ForeignKey(default=policy.models.default_team, on_delete=django.db.models.deletion.PROTECT, related_name='server_groups', to='policy.team'),
        ),
    ]
