from django.apps import AppConfig


class RegistryConfig(AppConfig):
    name = "registry"
    verbose_name = "Registry: upstream servers and their tools"

    def ready(self) -> None:
        # The Celery app, before any task is published from this process (registry/executor.py).
        import gateway_project.celery  # noqa: F401
        from policy.sign_off_listeners import on_sign_off_asked
        from registry.services import upstream_changed_resync, upstream_health_store
        from registry.sign_off_notify import sign_off_notify_soon
        from registry.upstreams.loop import on_upstream_change, on_upstream_health

        on_upstream_change(upstream_changed_resync)
        on_upstream_health(upstream_health_store)
        on_sign_off_asked(sign_off_notify_soon)  # the notification goes through the egress guard, here in registry
