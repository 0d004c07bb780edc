# ConfigVersion moved here from handoff (policy/config_version.py owns it now): its table stays as it was.
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("policy", "0004_visible_names"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="ConfigVersion",
                    fields=[
                        ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                        ("version", models.PositiveBigIntegerField(default=0)),
                    ],
                    options={"db_table": "handoff_configversion"},
                ),
            ],
        ),
    ]
