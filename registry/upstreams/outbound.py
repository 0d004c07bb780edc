"""A sandbox's `outbound` network: a user-mode stack (slirp4netns) in the sandbox's own network namespace, which
makes the server's connections from the host as ordinary sockets. What the egress guard refuses HTTP upstreams is
refused here by routes inside the namespace (`prohibit`: the server's connect fails with EACCES): private ranges,
link-local (cloud metadata), every other address that is not global, and the host's own addresses, unless the
upstream is internal (or GATEWAY_EGRESS_ALLOWED_NETWORKS allows a network). The host's loopback is never reachable
(`--disable-host-loopback`): the gateway's stores listen there.

bwrap says the sandbox's process id on a pipe (`--info-fd`) and waits on another (`--block-fd`) before it runs the
server, so the network is up and its routes in place before the server's first packet. slirp4netns only makes the
tap device: its own `--configure` would bring the loopback up too, which bwrap (not root) does itself after the
wait, and fails if it finds it done. Not root, the namespace belongs to the user namespace bwrap made first, where
the gateway's uid is 0: slirp4netns and `ip` enter that one, found from the network namespace (`NS_GET_USERNS`), not
from the process, which moves on into a nested one a moment later. bwrap says the process id before the process has
written that namespace's id maps, and a program started in it before then runs without capabilities there
(slirp4netns: "setns(CLONE_NEWNET): Operation not permitted"), so they enter it once the maps are written."""

import fcntl
import ipaddress
import json
import os
import shutil
import subprocess
import tempfile
from functools import cache

import anyio
from anyio.abc import Process
from django.conf import settings

from registry.upstreams.sandbox import SandboxRefused

RESOLVER = "10.0.2.3"  # slirp4netns's DNS, which forwards to the host's resolver
GATEWAY = "10.0.2.2"  # slirp4netns's router (the host's loopback behind it is disabled)
ADDRESS = "10.0.2.100/24"  # the sandbox's, as slirp4netns's `--configure` would give it
MTU = 65520
NS_GET_USERNS = 0xB701  # linux/nsfs.h: the user namespace that owns a namespace
SETUP_TIMEOUT = 10.0
# IANA's special-purpose IPv4 blocks that are not global (loopback is the sandbox's own).
NOT_GLOBAL = (
    "0.0.0.0/8",
    "10.0.0.0/8",
    "100.64.0.0/10",
    "169.254.0.0/16",
    "172.16.0.0/12",
    "192.0.0.0/24",
    "192.0.2.0/24",
    "192.168.0.0/16",
    "198.18.0.0/15",
    "198.51.100.0/24",
    "203.0.113.0/24",
    "224.0.0.0/4",
    "240.0.0.0/4",
)


@cache
def _resolv_folder() -> str:
    folder = tempfile.mkdtemp(prefix="switchboard-outbound-")
    os.chmod(folder, 0o755)
    return folder


def resolv_conf() -> str:
    """A resolv.conf naming slirp4netns's DNS, bound over the sandbox's /etc/resolv.conf (the host's may name a
    resolver on its own loopback, which the sandbox cannot reach)."""
    path = os.path.join(_resolv_folder(), "resolv.conf")
    if not os.path.exists(path):  # made once a process, again if a cleaner took it
        os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
        with open(path, "w") as file:
            file.write(f"nameserver {RESOLVER}\n")
        os.chmod(path, 0o644)
    return path


def _host_addresses() -> list[str]:
    """The host's own IPv4 addresses, which the sandbox would otherwise reach through slirp4netns."""
    listed = subprocess.run(["ip", "-j", "-4", "address", "show"], capture_output=True, text=True, check=True)
    return [a["local"] for link in json.loads(listed.stdout) for a in link.get("addr_info", []) if "local" in a]


def configuration(internal: bool) -> str:
    """`ip -batch` lines for the sandbox's namespace: its tap device up, and what it may not reach prohibited."""
    lines = [f"link set tap0 mtu {MTU} up", f"address add {ADDRESS} dev tap0", f"route add default via {GATEWAY}"]
    if not internal:
        refused = [*NOT_GLOBAL, *(f"{address}/32" for address in _host_addresses())]
        allowed = [str(ipaddress.ip_network(net)) for net in settings.GATEWAY_EGRESS_ALLOWED_NETWORKS]
        lines += [f"route add prohibit {net}" for net in dict.fromkeys(refused) if net not in allowed]
        lines += [f"route add {net} via {GATEWAY}" for net in allowed if ipaddress.ip_network(net).version == 4]
    return "".join(f"{line}\n" for line in lines)


class Outbound:
    """One sandbox's network: the pipes bwrap reports on and waits on, and the slirp4netns serving it."""

    def __init__(self, internal: bool) -> None:
        for tool in ("slirp4netns", "nsenter", "ip"):
            if shutil.which(tool) is None:
                raise SandboxRefused(f"{tool} is not installed where upstreams run (network `outbound`)")
        self._internal = internal
        self._info, self.info_fd = os.pipe()
        self.block_fd, self._unblock = os.pipe()
        self._exit, self._exit_writer = os.pipe()
        self._open = {self._info, self.info_fd, self.block_fd, self._unblock, self._exit, self._exit_writer}
        self._held: tuple[int, ...] = ()  # the sandbox's namespaces, once it runs
        self._slirp: Process | None = None

    def bwrap_options(self) -> list[str]:
        """bwrap's options for it: the pipes, and the resolver slirp4netns serves."""
        resolver = ["--ro-bind", resolv_conf(), "/etc/resolv.conf"]
        return ["--info-fd", str(self.info_fd), "--block-fd", str(self.block_fd), *resolver]

    def _close(self, fd: int) -> None:
        if fd in self._open:
            self._open.discard(fd)
            os.close(fd)

    async def start(self) -> None:
        """Once bwrap runs: the network up, its routes in place, then the server let run."""
        self._close(self.info_fd)  # bwrap's now: the read below ends when bwrap closes it
        self._close(self.block_fd)
        try:
            with anyio.fail_after(SETUP_TIMEOUT):
                said = await anyio.to_thread.run_sync(_read_all, self._info)
                pid = json.loads(said)["child-pid"]
                self._namespaces(pid)
                if len(self._held) > 1:
                    await ids_mapped(pid)
                await self._serve()
                batch = await anyio.to_thread.run_sync(configuration, self._internal)
                command = [*self._entered(f"--net=/proc/self/fd/{self._held[0]}"), "ip", "-batch", "-"]
                await anyio.run_process(command, input=batch.encode(), pass_fds=self._held)
        except subprocess.CalledProcessError as exc:
            said = exc.stderr.decode(errors="replace").strip()
            raise SandboxRefused(f"its outbound network was not made: {' '.join(exc.cmd[-3:])}: {said}") from exc
        except (OSError, ValueError, KeyError, TimeoutError) as exc:
            raise SandboxRefused(f"its outbound network was not made: {exc}") from exc
        os.write(self._unblock, b"1")
        self._close(self._unblock)

    def _namespaces(self, pid: int) -> None:
        """Holds the sandbox's network namespace and, not root, the user namespace that owns it."""
        self._held = (os.open(f"/proc/{pid}/ns/net", os.O_RDONLY),)
        self._open.add(self._held[0])
        if os.geteuid() != 0:
            self._held += (fcntl.ioctl(self._held[0], NS_GET_USERNS),)
            self._open.add(self._held[1])

    def _entered(self, *namespaces: str) -> list[str]:
        """The start of a command line that runs the rest in the held user namespace (not root) and `namespaces`
        (nsenter's options), as a child process given the held ones sees them."""
        user = [f"--user=/proc/self/fd/{fd}" for fd in self._held[1:]]
        return ["nsenter", *namespaces, *user, "--preserve-credentials"] if namespaces or user else []

    async def _serve(self) -> None:
        ready, ready_writer = os.pipe()
        command = [*self._entered(), "slirp4netns", f"--mtu={MTU}", "--disable-host-loopback", "--enable-sandbox"]
        command += ["--enable-seccomp", f"--ready-fd={ready_writer}", f"--exit-fd={self._exit}", "--netns-type=path"]
        try:
            self._slirp = await anyio.open_process(
                [*command, f"/proc/self/fd/{self._held[0]}", "tap0"], pass_fds=(ready_writer, self._exit, *self._held),
                stdout=subprocess.DEVNULL,
            )  # fmt: skip
        finally:
            os.close(ready_writer)
            self._close(self._exit)  # slirp4netns's: it ends once the writer, ours, closes
        try:
            if await anyio.to_thread.run_sync(os.read, ready, 1) != b"1":
                raise OSError(f"slirp4netns ended before its network was up: {await _said(self._slirp)}")
        finally:
            os.close(ready)

    def close(self) -> None:
        """Closes its pipes (slirp4netns ends once its exit pipe closes)."""
        for fd in list(self._open):
            self._close(fd)

    async def stop(self) -> None:
        """Closes its pipes and waits for slirp4netns to end."""
        self.close()
        if self._slirp is not None:
            with anyio.move_on_after(SETUP_TIMEOUT, shield=True):
                await self._slirp.wait()
            if self._slirp.returncode is None:
                self._slirp.kill()
            await self._slirp.aclose()


async def ids_mapped(pid: int) -> None:
    """Returns once the user namespace of process `pid` maps its groups (the map bwrap writes last)."""
    while not await anyio.Path(f"/proc/{pid}/gid_map").read_text():
        await anyio.sleep(0.001)


async def _said(process: Process) -> str:
    """What a process that ended wrote on its standard error."""
    try:
        return (await process.stderr.receive()).decode(errors="replace").strip()
    except anyio.EndOfStream:
        return "(nothing on its standard error)"


def _read_all(fd: int) -> bytes:
    data = b""
    while chunk := os.read(fd, 4096):
        data += chunk
    return data
