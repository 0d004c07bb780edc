"""Plumbing every app may import, and which imports no app: Redis clients, database threads, process tasks,
keys and signing (the bottom layer of .importlinter)."""
