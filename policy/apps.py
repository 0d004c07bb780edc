from django.apps import AppConfig


class PolicyConfig(AppConfig):
    name = "policy"
    verbose_name = "Policy: agents, groups and rules"
