"""Limits on calls that need state every web process sees: group isolation, circuit breakers, call limits and
rates. `admission` holds what a call claims and the refusals written for the model; `stores` the two homes
of that state (Redis, or this process's memory in the embedded default)."""
