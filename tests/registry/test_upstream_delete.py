import threading

import psycopg
import pytest
from django.db import connection
from django.utils import timezone

from registry.models import Tool, Upstream
from tests.helpers import eventually


def _waiting_backends(dsn: dict) -> int:
    with psycopg.connect(**dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND wait_event_type = 'Lock'", [dsn["dbname"]]
        ).fetchone()
    return row[0] if row else 0


@pytest.mark.django_db(transaction=True)  # the delete and the sync commit in connections of their own
def test_deleting_an_upstream_while_its_catalog_syncs_waits_for_the_sync_instead_of_deadlocking():
    upstream = Upstream.objects.create(slug="syncing", transport="streamable_http", url="http://127.0.0.1:9/mcp")
    tool = Tool.objects.create(upstream=upstream, name="echo", definition={}, last_seen_at=timezone.now())
    db = connection.settings_dict
    dsn = {"host": db["HOST"], "port": db["PORT"], "user": db["USER"], "dbname": db["NAME"]}
    failures: list[BaseException] = []

    def delete() -> None:
        try:
            upstream.delete()
        except BaseException as error:  # reported to the test's thread
            failures.append(error)
        finally:
            connection.close()

    # A catalog sync's order: the upstream's row first (FOR UPDATE), then its tools.
    with psycopg.connect(**dsn) as sync:
        sync.execute("SELECT id FROM registry_upstream WHERE id = %s FOR UPDATE", [upstream.pk])
        deleter = threading.Thread(target=delete)
        deleter.start()
        eventually(lambda: _waiting_backends(dsn) >= 1)
        sync.execute("UPDATE registry_tool SET description = 'synced' WHERE id = %s", [tool.pk])
        sync.commit()
    deleter.join(timeout=30)

    assert not deleter.is_alive() and failures == []
    assert not Upstream.objects.filter(pk=upstream.pk).exists() and not Tool.objects.filter(pk=tool.pk).exists()
