"""A stdio server's sandbox: bubblewrap (`bwrap`) runs it in namespaces of its own, seeing only what it was given.

Bound read-only: the system's directories, the few files of /etc that programs need, and of everything else only
the command's own files (its executable, the prefix it runs from: a virtual environment, an interpreter's
installation, a node_modules folder; arguments that name an existing file or folder) and the paths its upstream
lists. Private: a home and /tmp (tmpfs, size-capped), processes (its own PID namespace), the network (`none`: only
its own loopback; `outbound`: the public internet, registry/upstreams/outbound.py) and IPC. Never bound: `/`,
/run, /var, /home, /root, the host's /tmp, the gateway's `var/`, `.git` and secret files. As root, each server
runs as an unprivileged uid (root inside a user namespace of its own is still uid 0 on the files it is given). Its
environment travels in the process's environment, never on bwrap's command line, which every local user can read in
`ps`."""

import os
import shutil
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.conf import settings

HOME = "/home/upstream"
SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
ETC = (
    "ld.so.cache",
    "passwd",
    "group",
    "nsswitch.conf",
    "hosts",
    "resolv.conf",
    "ssl/certs",
    "ssl/openssl.cnf",
    "localtime",
    "alternatives",  # Debian's /usr/bin/node and others are symlinks through it
)
NEVER = ("/", "/run", "/var", "/home", "/root", "/tmp", "/proc", "/sys", "/dev", "/etc")
NETWORKS = ("none", "outbound", "host")
DEFAULT_NETWORK = "none"


class SandboxRefused(Exception):
    """The server was not started: its sandbox cannot be made, or its settings would open what must stay shut."""


# An upstream's limits, by their JSON names in its `sandbox` setting: the field, the bounds, the default's setting.
LIMITS = {
    "memoryMb": ("memory_mb", 16, 1_048_576, "GATEWAY_STDIO_SANDBOX_MEMORY_MB"),
    "pids": ("pids", 8, 4_194_304, "GATEWAY_STDIO_SANDBOX_PIDS"),
    "cpus": ("cpus", 0.01, 1024, "GATEWAY_STDIO_SANDBOX_CPUS"),
}


def _default(name: str) -> Any:
    return field(default_factory=lambda: getattr(settings, LIMITS[name][3]))


@dataclass(frozen=True)
class SandboxSettings:
    """An upstream's own: its network, paths it is given beyond its command's (`/srv/data`, `/srv/out:rw`), and
    its limits (registry/upstreams/limits.py), the gateway's defaults unless it says."""

    network: str = DEFAULT_NETWORK
    paths: tuple[str, ...] = field(default_factory=tuple)
    memory_mb: int = _default("memoryMb")
    pids: int = _default("pids")
    cpus: float = _default("cpus")
    internal: bool = False  # the upstream's: its `outbound` network may reach private addresses

    @classmethod
    def from_json(cls, value: dict[str, Any] | None, internal: bool = False) -> "SandboxSettings":
        value = value or {}
        limits = {LIMITS[name][0]: value[name] for name in LIMITS if name in value}
        network, paths = value.get("network", DEFAULT_NETWORK), tuple(value.get("paths", ()))
        return cls(network=network, paths=paths, internal=internal, **limits)


def protected() -> tuple[Path, ...]:
    """What no sandbox is given, nor any folder holding it: the gateway's keys and database, its history, and every
    secret file a setting names (`SECRET_KEY_FILE`, `GATEWAY_CREDENTIAL_KEYS_FILE`...)."""
    named = [value for name, value in os.environ.items() if name.endswith("_FILE") and value.startswith("/")]
    database = settings.DATABASES["default"]
    sqlite = [database["NAME"]] if database["ENGINE"].endswith("sqlite3") else []
    paths = [settings.VAR_DIR, settings.BASE_DIR / ".git", *sqlite, *named]
    return tuple(Path(os.path.realpath(p)) for p in paths)


def path_problem(path: str) -> str | None:
    """Why a path may not be given to a sandbox, in the operator's words; None when it may."""
    if not path.startswith("/"):
        return f"{path!r} is not an absolute path"
    real = Path(os.path.realpath(path))
    if str(real) in NEVER or path.rstrip("/") in NEVER:
        return f"{path!r} would give the server the whole of {real}"
    for kept in protected():
        if real == kept or kept in real.parents or real in kept.parents:
            return f"{path!r} holds or is inside the gateway's own {kept} (keys, database, history)"
    return None


def sandbox_problem(value: Any) -> str | None:
    """Why an upstream's `sandbox` setting is refused; None when it is sound."""
    if not isinstance(value, dict):
        return 'A JSON object: {"network": "none", "memoryMb": 512, "paths": ["/srv/data", "/srv/out:rw"]}.'
    if unknown := set(value) - {"network", "paths", *LIMITS}:
        return f"Unknown sandbox setting {sorted(unknown)[0]!r}: network, paths, {', '.join(LIMITS)} are known."
    if value.get("network", DEFAULT_NETWORK) not in NETWORKS:
        return f"network must be one of {', '.join(NETWORKS)}, not {value.get('network')!r}."
    for name, (_, least, most, _) in LIMITS.items():
        limit = value.get(name, least)
        kinds = (int, float) if name == "cpus" else (int,)
        if isinstance(limit, bool) or not isinstance(limit, kinds) or not least <= limit <= most:
            return f"{name} must be a {'number' if name == 'cpus' else 'whole number'} from {least} to {most}."
    paths = value.get("paths", [])
    if not isinstance(paths, list) or not all(isinstance(p, str) for p in paths):
        return "paths must be a JSON list of strings."
    for entry in paths:
        if problem := path_problem(entry.removesuffix(":rw")):
            return f"paths: {problem}."
    return None


def _interpreter(executable: str) -> str | None:
    """The interpreter a script names on its first line (`#!/srv/venv/bin/python`), if it names one by path."""
    try:
        with open(executable, "rb") as script:
            first = script.readline(512)
    except OSError:
        return None
    words = first[2:].decode(errors="replace").split() if first.startswith(b"#!") else []
    return words[0] if words and words[0].startswith("/") else None


def _package(path: Path) -> Path | None:
    """The node_modules folder a path lies in: a package's script imports its siblings and its dependencies."""
    return Path(*path.parts[: path.parts.index("node_modules") + 1]) if "node_modules" in path.parts else None


def _own_files(executable: str, argv: Iterable[str]) -> list[str]:
    """The command's own files: where its executable and a script's interpreter live (a virtual environment or an
    installation's prefix, a node_modules folder, else the file itself) and each argument that names an existing
    file or folder (the node_modules folder of one inside a package)."""
    found = []
    programs = [executable, *filter(None, [_interpreter(executable)])]
    for path in (Path(p) for program in programs for p in (program, os.path.realpath(program))):
        if package := _package(path):
            found.append(str(package))
        elif path.parent.name == "bin":
            found.append(str(path.parent.parent))  # a venv (pyvenv.cfg) or an installation's prefix
        else:
            found.append(str(path))
    found += [str(_package(Path(a)) or a) for a in argv if a.startswith("/") and os.path.exists(a)]
    return [p for p in found if p != "/" and not _system(p)]


def _system(path: str) -> bool:
    """Whether a path is in the system's directories, which every sandbox has."""
    return any(path == s or path.startswith(s + "/") for s in SYSTEM)


def _folders(paths: Iterable[str], given: set[str]) -> list[str]:
    """bwrap's arguments that make each folder above the paths, top first, readable by the server and not writable:
    bwrap would make a missing one mode 0700 as root, closed to it, and one the server owns (not root) writable."""
    made: list[str] = []
    for path in paths:
        for parent in reversed(Path(path).parents):
            folder = str(parent)
            if folder != "/" and folder not in made and folder not in given and not _system(folder):
                made.append(folder)
    return [arg for folder in made for arg in ("--perms", "0555", "--dir", folder)]


def bwrap_command(
    executable: str, args: list[str], cwd: str | None, sandbox: SandboxSettings, options: Iterable[str] = ()
) -> list[str]:
    """The bwrap command line that runs `executable args` confined, with bwrap's `options` last (an `outbound`
    network's). Refuses a path the sandbox may not be given."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise SandboxRefused(
            "bubblewrap is not installed where upstreams run (Debian package `bubblewrap`); "
            "GATEWAY_STDIO_SANDBOX=off runs stdio servers unconfined"
        )
    given = {}  # destination: writable
    for entry in sandbox.paths:
        path = entry.removesuffix(":rw")
        if problem := path_problem(path):
            raise SandboxRefused(problem)
        given[path] = entry.endswith(":rw")
    own = _own_files(executable, args) + ([cwd] if cwd else [])
    for path in own:
        if problem := path_problem(path):
            raise SandboxRefused(f"the command's own {problem}")
        given.setdefault(path, False)
    root = os.geteuid() == 0
    host = sandbox.network == "host"
    # As root, no user namespace: bwrap's would map the server's uid to root's; setpriv drops to an unprivileged
    # uid and every capability instead. Otherwise every namespace, the user's included (no capabilities at all).
    if root:
        namespaces = ["--unshare-ipc", "--unshare-pid", "--unshare-uts", "--unshare-cgroup-try"]
        namespaces += [] if host else ["--unshare-net"]
    else:
        namespaces = ["--unshare-all", *(["--share-net"] if host else [])]
    command = [bwrap, *namespaces, "--die-with-parent", "--new-session"]
    for path in SYSTEM:
        if os.path.islink(path):
            command += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            command += ["--ro-bind", path, path]
    etc = [f"/etc/{name}" for name in ETC if os.path.exists(f"/etc/{name}")]
    command += _folders(etc, set()) + [arg for path in etc for arg in ("--ro-bind", path, path)]
    command += ["--proc", "/proc", "--dev", "/dev"]
    size = str(settings.GATEWAY_STDIO_SANDBOX_TMP_MB << 20)
    command += ["--perms", "01777", "--size", size, "--tmpfs", "/tmp"]
    command += ["--perms", "0777", "--size", size, "--tmpfs", HOME]
    command += _folders(list(given), set(given))  # after the tmpfs: a given path may lie under /tmp
    for path, writable in given.items():
        command += ["--bind" if writable else "--ro-bind", path, path]
    # Last of the mounts: not root, the server owns the sandbox's root (a tmpfs without a size) and could fill memory.
    command += ["--chdir", cwd or HOME, *options, "--remount-ro", "/"]
    if root:
        uid = str(settings.GATEWAY_STDIO_SANDBOX_UID)
        command += ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--inh-caps=-all"]
        command += ["--bounding-set=-all", "--no-new-privs", "--"]
    return [*command, executable, *args]
