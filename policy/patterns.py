"""Shell patterns ('*', '?') over the names agents see: what an API key's tool list, a virtual server's offers and
its overrides are matched by."""

from collections.abc import Iterable
from fnmatch import fnmatchcase


def name_matches(name: str, patterns: Iterable[str]) -> bool:
    """Whether any of the patterns matches `name`, case-sensitively (MCP's names are)."""
    return any(fnmatchcase(name, pattern) for pattern in patterns)
