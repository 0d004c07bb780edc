# Credentials stored before teams keep their path (secret_team "") until manage.py move_credentials.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('registry', '0016_teams'),
    ]

    operations = [
        migrations.AddField(
            model_name='personalcredential',
            name='secret_team',
            field=models.CharField(blank=True, editable=False, max_length=32),
        ),
    ]
