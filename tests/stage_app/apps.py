from django.apps import AppConfig


class StageAppConfig(AppConfig):
    name = "tests.stage_app"
    label = "test_stages"
    verbose_name = "Test stages"
