import django.db.models.deletion
import policy.models
from django.db import migrations, models


def default_team(apps, schema_editor) -> None:
    """Every upstream that exists belongs to the default team (made by policy's 0010_teams)."""
    db = schema_editor.connection.alias
    team = apps.get_model("policy", "Team").objects.using(db).get(slug="default")
    apps.get_model("registry", "Upstream").objects.using(db).filter(team__isnull=True).update(team=team)


class Migration(migrations.Migration):

    dependencies = [
        ('policy', '0010_teams'),
        ('registry', '0015_upstream_package'),
    ]

    operations = [
        migrations.AddField(
            model_name='upstream',
            name='shared_with',
            field=models.ManyToManyField(blank=True, help_text='Teams that may call its tools (under their own rules), not change it', related_name='borrowed_upstreams', to='policy.team'),
        ),
        migrations.AddField(
            model_name='upstream',
            name='shared_with_all',
            field=models.BooleanField(default=False, help_text='Every other team may call its tools (under their own rules), not change it'),
        ),
        migrations.AddField(
            model_name='upstream',
            name='team',
            field=models.ForeignKey(null=True, on_delete=django.db.models.deletion.PROTECT, related_name='upstreams', to='policy.team'),
        ),
        migrations.RunPython(default_team, migrations.RunPython.noop),
        migrations.AlterField(
            model_name='upstream',
            name='team',
            field=models.ForeignKey(default=policy.models.default_team, on_delete=django.db.models.deletion.PROTECT, related_name='upstreams', to='policy.team'),
        ),
    ]
