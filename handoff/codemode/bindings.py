"""How tools appear to code: `tools.<namespace>.<method>(args)`, namespaces and methods in camelCase.

Every binding is data (a namespace, a method, the exposed name it stands for): the sandbox builds its
objects from it, nothing is generated as source. Names that are no safe identifier, that JavaScript
objects treat specially (`__proto__`, `constructor`, `then`, ...) or that two tools would share are
refused, and the tool stays out of code (search says why)."""

import re
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from policy.manifest import RESERVED_NAMES

IDENTIFIER = re.compile(r"[A-Za-z_$][A-Za-z0-9_$]*", re.ASCII)
# Beyond Object.prototype's names: `then` makes an object a thenable (`await tools.x` would call it), and
# `toJSON` changes what JSON.stringify sees.
UNSAFE_NAMES = RESERVED_NAMES | {"then", "toJSON", "__proto__"}


def camel_case(name: str) -> str:
    """`list_commits`, `list-commits` and `list.commits` all become `listCommits`; `getTime` stays."""
    first, *rest = [part for part in re.split(r"[_.\-]+", name) if part] or [""]
    return first + "".join(part[0].upper() + part[1:] for part in rest)


def identifier_problem(name: str) -> str | None:
    if not IDENTIFIER.fullmatch(name):
        return "is not a JavaScript identifier"
    if name in UNSAFE_NAMES:
        return "is a name JavaScript objects reserve"
    return None


@dataclass(frozen=True)
class Binding:
    exposed_name: str
    namespace: str  # the upstream's slug in camelCase
    method: str

    @property
    def path(self) -> str:
        return f"tools.{self.namespace}.{self.method}"


@dataclass(frozen=True)
class Bindings:
    by_name: dict[str, Binding]  # exposed name -> binding
    by_path: dict[tuple[str, str], Binding]  # (namespace, method) -> binding
    refused: dict[str, str]  # exposed name -> why code cannot call it

    def only(self, permitted: Callable[[str], bool]) -> "Bindings":
        """The bindings of the tools `permitted` lets a caller use: all that its code can reach."""
        by_name = {name: binding for name, binding in self.by_name.items() if permitted(name)}
        return Bindings(by_name, {(b.namespace, b.method): b for b in by_name.values()}, {})

    def tree(self) -> dict[str, dict[str, str]]:
        """What the sandbox builds its objects from: namespace -> method -> exposed name."""
        tree: dict[str, dict[str, str]] = defaultdict(dict)
        for binding in self.by_name.values():
            tree[binding.namespace][binding.method] = binding.exposed_name
        return dict(tree)


def bindings_build(tools: Iterable[tuple[str, str, str]]) -> Bindings:
    """Bindings for (exposed name, upstream slug, tool name) triples. Two tools of one upstream whose
    methods would coincide (`list_items` and `listItems`) are both refused rather than one shadowing the
    other; so are upstreams whose namespaces would coincide."""
    wanted: dict[tuple[str, str], list[str]] = defaultdict(list)
    namespaces: dict[str, set[str]] = defaultdict(set)
    refused: dict[str, str] = {}
    for exposed, slug, tool in tools:
        namespace, method = camel_case(slug), camel_case(tool)
        bad = method if identifier_problem(method) else namespace
        if problem := identifier_problem(bad):
            refused[exposed] = f"{bad!r} {problem}"
            continue
        namespaces[namespace].add(slug)
        wanted[(namespace, method)].append(exposed)
    by_name = {}
    for (namespace, method), names in wanted.items():
        if len(namespaces[namespace]) > 1:
            for name in names:
                refused[name] = f"namespace {namespace!r} would stand for several upstreams"
        elif len(names) > 1:
            for name in names:
                refused[name] = f"{namespace}.{method} would stand for several tools: {', '.join(sorted(names))}"
        else:
            by_name[names[0]] = Binding(names[0], namespace, method)
    return Bindings(by_name, {(b.namespace, b.method): b for b in by_name.values()}, refused)
