import django.db.models.deletion
import policy.models
from django.db import migrations, models


def default_team(apps, schema_editor) -> None:
    """Every handoff route that exists belongs to the default team (made by policy's 0010_teams)."""
    db = schema_editor.connection.alias
    team = apps.get_model("policy", "Team").objects.using(db).get(slug="default")
    apps.get_model("handoff", "HandoffRoute").objects.using(db).filter(team__isnull=True).update(team=team)


class Migration(migrations.Migration):

    dependencies = [
        ('handoff', '0004_connect_timeout_bound'),
        ('policy', '0010_teams'),
    ]

    operations = [
        migrations.AddField(
            model_name='handoffroute',
            name='team',
            field=models.ForeignKey(null=True, on_delete=django.db.models.deletion.PROTECT, related_name='handoff_routes', to='policy.team'),
        ),
        migrations.RunPython(default_team, migrations.RunPython.noop),
        migrations.AlterField(
            model_name='handoffroute',
            name='team',
            field=models.ForeignKey(default=policy.models.default_team, on_delete=django.db.models.deletion.PROTECT, related_name='handoff_routes', to='policy.team'),
        ),
    ]
