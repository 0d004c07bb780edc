import os

from celery import Celery
from celery.signals import beat_init, celeryd_after_setup, worker_ready, worker_shutting_down

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gateway_project.settings")

app = Celery("gateway_project")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
# Agents' calls pushed past Celery's consumer (GATEWAY_CALL_TRANSPORT=direct) are taken by every worker, whatever
# the web processes' setting, so workers can be upgraded first. By name: Django is not set up yet.
app.steps["worker"].add("registry.call_consumer:CallConsumerStep")


# Handoff tunnels are pinned to the worker process that opened them (registry/worker.py).
@celeryd_after_setup.connect
def _consume_own_queue(sender: str, instance, **kwargs) -> None:
    from registry.worker import worker_consume_own_queue

    worker_consume_own_queue(sender, instance.app)


@worker_ready.connect
def _start_heartbeat(**kwargs) -> None:
    from registry.upstreams.loop import pool_thread
    from registry.upstreams.relay import cancel_listener
    from registry.worker import heartbeat_start

    heartbeat_start()
    pool_thread().submit(cancel_listener())  # agents' cancellations reach the calls this process runs


@worker_ready.connect
@beat_init.connect
def _warn_of_settings(**kwargs) -> None:
    """What `manage.py check` would say of the environment: a worker or beat runs no checks of its own."""
    from gateway_project.checks import start_warnings_log

    start_warnings_log()


@worker_shutting_down.connect
def _close_tunnels(**kwargs) -> None:
    """Graceful shutdown: the tunnels this worker holds are closed and their agents told."""
    from handoff.tasks import tunnels_close_on_shutdown
    from registry.worker import heartbeat_stop

    heartbeat_stop()
    tunnels_close_on_shutdown()
