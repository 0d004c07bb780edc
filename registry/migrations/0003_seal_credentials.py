from django.db import migrations

from registry.credentials import credentials_seal


def seal_stored_credentials(apps, schema_editor):
    """Env and header values stored in clear before sealing existed are sealed in place."""
    Upstream = apps.get_model("registry", "Upstream")
    for upstream in Upstream.objects.exclude(env={}, headers={}):
        upstream.env = credentials_seal(upstream.env)
        upstream.headers = credentials_seal(upstream.headers)
        upstream.save(update_fields=["env", "headers"])


class Migration(migrations.Migration):
    dependencies = [("registry", "0002_limits_rules_pins")]

    operations = [migrations.RunPython(seal_stored_credentials, migrations.RunPython.noop)]
