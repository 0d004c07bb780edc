from django.db import migrations, models


class AddIndexWithoutBlockingWrites(migrations.AddIndex):
    """On PostgreSQL the index is built CONCURRENTLY: a plain CREATE INDEX would hold every audit row's insert,
    and so every call, for as long as it reads the whole trail. Elsewhere (SQLite), a plain one."""

    def database_forwards(self, app_label, schema_editor, from_state, to_state) -> None:
        if schema_editor.connection.vendor != "postgresql":
            return super().database_forwards(app_label, schema_editor, from_state, to_state)
        model = to_state.apps.get_model(app_label, self.model_name)
        if self.allow_migrate_model(schema_editor.connection.alias, model):
            schema_editor.add_index(model, self.index, concurrently=True)

    def database_backwards(self, app_label, schema_editor, from_state, to_state) -> None:
        if schema_editor.connection.vendor != "postgresql":
            return super().database_backwards(app_label, schema_editor, from_state, to_state)
        model = from_state.apps.get_model(app_label, self.model_name)
        if self.allow_migrate_model(schema_editor.connection.alias, model):
            schema_editor.remove_index(model, self.index, concurrently=True)


class Migration(migrations.Migration):
    """An index for reading one team's rows newest first (audit.selectors.audit_of_teams). Adding an index
    touches no row: the trigger refusing UPDATE is not involved."""

    atomic = False  # CREATE INDEX CONCURRENTLY cannot run inside a transaction

    dependencies = [
        ("audit", "0009_sign_off_kinds"),
    ]

    operations = [
        AddIndexWithoutBlockingWrites(
            model_name="auditevent",
            index=models.Index(fields=["team", "-id"], name="audit_team_idx"),
        ),
    ]
