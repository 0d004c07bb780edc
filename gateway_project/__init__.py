"""The project's wiring (settings, URLs, ASGI, the Celery app) and `lib/`, the plumbing every app may import.
The Celery app is loaded by registry's AppConfig, not here: `lib` is imported by processes without Django
(a specialist verifying delegation tokens) that must not load it."""

# The one place the version is written: serverInfo, /readyz and the console footer read it (CHANGELOG.md says
# what each version changed).
__version__ = "0.1.0"
