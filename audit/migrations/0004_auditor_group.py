from django.db import migrations

AUDITOR_GROUP = "Auditor"  # audit.selectors.AUDITOR_GROUP: who sees argument payloads


def auditor_group(apps, schema_editor) -> None:
    apps.get_model("auth", "Group").objects.get_or_create(name=AUDITOR_GROUP)


class Migration(migrations.Migration):
    dependencies = [("audit", "0003_integrity"), ("auth", "0012_alter_user_first_name_max_length")]
    operations = [migrations.RunPython(auditor_group, migrations.RunPython.noop)]
