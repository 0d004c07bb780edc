from django.apps import AppConfig
from django.db.models.signals import m2m_changed, post_delete, post_save
from django.utils.module_loading import autodiscover_modules

# The rows routing reads: each saved or deleted one moves the snapshot version.
ROUTING_MODELS = (
    "policy.Agent",
    "policy.AgentGroup",
    "policy.AgentKey",
    "policy.IdentityProvider",
    "policy.Person",
    "policy.Rule",
    "policy.ServerGroup",
    "policy.Team",  # its slug, on every row an agent of it writes
    "policy.TeamGroup",  # who may call as one of a team
    "registry.Upstream",
    "registry.Tool",
    "handoff.HandoffRoute",
    "registry.LocalPrefix",  # a team's names for a borrowed upstream
    "registry.VirtualServer",  # a curated endpoint
)


class HandoffConfig(AppConfig):
    name = "handoff"
    verbose_name = "MCP sessions and routing"

    def ready(self) -> None:
        from handoff.mcp.list_changed import upstream_changed_tell
        from handoff.mcp.pipeline.sign_off import decided_tell
        from policy.config_version import on_routing_row_changed
        from policy.sign_off_listeners import on_sign_off_decided
        from registry.upstreams.loop import on_upstream_change

        # In its own transaction, whatever saved the row (a service, an admin form, a shell); queryset updates
        # call config_changed() themselves.
        for label in ROUTING_MODELS:
            model = self.apps.get_model(label)
            post_save.connect(on_routing_row_changed, sender=model, dispatch_uid=f"snapshot-{model.__name__}-save")
            post_delete.connect(on_routing_row_changed, sender=model, dispatch_uid=f"snapshot-{model.__name__}-del")
        agent_members = self.apps.get_model("policy.AgentGroup").agents.through
        shares = self.apps.get_model("registry.Upstream").shared_with.through
        m2m_changed.connect(on_routing_row_changed, sender=agent_members, dispatch_uid="snapshot-members")
        m2m_changed.connect(on_routing_row_changed, sender=shares, dispatch_uid="snapshot-shares")
        on_upstream_change(upstream_changed_tell)  # after registry's resync (INSTALLED_APPS order)
        on_sign_off_decided(decided_tell)  # a sign-off decided wakes the calls waiting for it
        autodiscover_modules("triage")  # Python triage tools (handoff/triage.py)
        import handoff.result_filter  # noqa: F401  the built-in after-execute stage, first of its chain

        autodiscover_modules("stages")  # stages of the operator's apps (handoff/stages.py)
