import django.core.validators
from django.db import migrations, models

# A team's limits over all its agents together; empty: the deployment's GATEWAY_TEAM_* default.
LIMITS = (
    ("calls_per_minute", "Tool calls in any 60 seconds; empty: GATEWAY_TEAM_CALLS_PER_MINUTE"),
    ("daily_calls", "Tool calls in one day, 00:00 to 24:00 UTC; empty: GATEWAY_TEAM_DAILY_CALLS"),
    ("max_concurrent", "Calls running at once; empty: GATEWAY_TEAM_MAX_CONCURRENT"),
)


class Migration(migrations.Migration):
    dependencies = [
        ("policy", "0010_teams"),
    ]

    operations = [
        migrations.AddField(
            model_name="team",
            name=name,
            field=models.PositiveIntegerField(
                blank=True, help_text=help_text, null=True, validators=[django.core.validators.MinValueValidator(1)]
            ),
        )
        for name, help_text in LIMITS
    ]
