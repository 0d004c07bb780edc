from django.db import migrations, models


class Migration(migrations.Migration):
    """Rows carry their team by value under seal version 3. Rows already written are never touched (a trigger
    refuses UPDATE, and their MACs cover what they hold): adding the columns fills them with "" and seal 0,
    which reads as "sealed before teams, of the default team" (audit.models.team_of); new rows get seal 3."""

    dependencies = [
        ("audit", "0007_person"),
    ]

    operations = [
        migrations.AddField(
            model_name="auditevent",
            name="team",
            field=models.CharField(blank=True, max_length=32),
        ),
        migrations.AddField(
            model_name="auditevent",
            name="seal",
            field=models.PositiveSmallIntegerField(default=0, editable=False),
        ),
        migrations.AlterField(
            model_name="auditevent",
            name="seal",
            field=models.PositiveSmallIntegerField(default=3, editable=False),
        ),
    ]
