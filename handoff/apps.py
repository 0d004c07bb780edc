from django.apps import AppConfig
from django.db.models.signals import m2m_changed, post_delete, post_save
from django.utils.module_loading import autodiscover_modules


class HandoffConfig(AppConfig):
    name = "handoff"
    verbose_name = "MCP sessions and routing"

    def ready(self) -> None:
        from handoff.mcp.list_changed import upstream_changed_tell
        from handoff.models import HandoffRoute
        from policy.config_version import on_routing_row_changed
        from policy.models import (
            Agent,
            AgentGroup,
            AgentKey,
            IdentityProvider,
            Person,
            Rule,
            ServerGroup,
            Team,
            TeamGroup,
        )
        from registry.models import Tool, Upstream
        from registry.upstreams.loop import on_upstream_change

        # Every saved or deleted row that routing reads moves the snapshot version, in its own transaction,
        # whatever saved it (a service, an admin form, a shell). Queryset updates call config_changed().
        for model in (
            Agent,
            AgentGroup,
            AgentKey,
            IdentityProvider,
            Person,
            Rule,
            ServerGroup,
            Team,  # its slug, on every row an agent of it writes
            TeamGroup,  # who may call as one of a team
            Upstream,
            Tool,
            HandoffRoute,
        ):
            post_save.connect(on_routing_row_changed, sender=model, dispatch_uid=f"snapshot-{model.__name__}-save")
            post_delete.connect(on_routing_row_changed, sender=model, dispatch_uid=f"snapshot-{model.__name__}-del")
        m2m_changed.connect(on_routing_row_changed, sender=AgentGroup.agents.through, dispatch_uid="snapshot-members")
        m2m_changed.connect(on_routing_row_changed, sender=Upstream.shared_with.through, dispatch_uid="snapshot-shares")
        on_upstream_change(upstream_changed_tell)  # after registry's resync (INSTALLED_APPS order)
        autodiscover_modules("triage")  # Python triage tools (handoff/triage.py)
        import handoff.result_filter  # noqa: F401  the built-in after-execute stage, first of its chain

        autodiscover_modules("stages")  # stages of the operator's apps (handoff/stages.py)
