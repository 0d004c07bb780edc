from django.apps import AppConfig


class TriageAppConfig(AppConfig):
    name = "examples.triage_app"
    label = "example_triage"
    verbose_name = "Example triage tools"
