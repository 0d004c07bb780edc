# ConfigVersion moved to policy (policy/migrations/0005_configversion.py): the table stays, only the state moves.
from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("handoff", "0002_routes_tunnels_claims"),
        ("policy", "0005_configversion"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(state_operations=[migrations.DeleteModel(name="ConfigVersion")]),
    ]
