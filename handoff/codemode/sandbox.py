"""The sandbox: the model's code in a Deno subprocess with no permissions at all (no network, file system,
environment or subprocesses), a V8 heap cap, a wall-clock timeout and caps on code size, output and
tool calls. Tool calls are JSON lines on the subprocess's stdio; `call` decides and runs each one (policy
and audit live there, not here). Every message from the sandbox is untrusted."""

import asyncio
import json
import os
import re
import resource
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.request import pathname2url

import anyio
from deno import find_deno_bin

from handoff.codemode.bindings import Binding, Bindings

PRELUDE = (Path(__file__).parent / "prelude.ts").as_uri()
MAIN = "main.ts"
HEADER_LINES = 2  # the lines main.ts puts before the model's code
STDERR_KEPT = 4096
DENO_START_MB = 640  # the data segment Deno 2.9 reserves to start (measured: 512 MB is too little)

# A tool call's answer as the sandbox gets it: {"ok": True, "value": ...} or {"ok": False, "error": {...}}.
ToolCall = Callable[[Binding, dict[str, Any]], Awaitable[dict[str, Any]]]


@dataclass(frozen=True)
class SandboxLimits:
    timeout: float
    heap_mb: int
    max_calls: int
    max_output_bytes: int


@dataclass
class SandboxRun:
    value: Any = None
    logs: list[str] = field(default_factory=list)
    calls: int = 0
    output_bytes: int = 0


class SandboxError(Exception):
    """The execution ended without a value: `code` is stable, `message` is for the model."""

    def __init__(self, code: str, message: str, calls: int = 0) -> None:
        super().__init__(message)
        self.code, self.message, self.calls = code, message, calls


# The execution's folder is a plain str joined with os.path, never a Path: pathlib interns each part of a path
# (sys.intern), and a folder with a new name each run would add an entry to CPython's table of interned strings each
# time, growing it until it doubles (docs/reliability.md, "What RSS keeps beyond Python's heap").


def _deno_command(workdir: str, heap_mb: int) -> list[str]:
    flags = ["--no-prompt", "--no-config", "--no-lock", "--no-npm", "--no-remote", "--quiet"]
    imports = f"--import-map={os.path.join(workdir, 'imports.json')}"
    main = os.path.join(workdir, MAIN)
    return [find_deno_bin(), "run", *flags, imports, f"--v8-flags=--max-old-space-size={heap_mb}", main]


def _prepare(workdir: str, code: str) -> dict[str, str]:
    """The execution's files, and its environment: nothing of the gateway's (the code could not read it
    anyway), and a Deno cache of its own, since localStorage and the Cache API persist there: a shared one
    would carry data from one execution (one agent, one strict group) to the next."""
    main = "file://" + pathname2url(os.path.join(workdir, MAIN))
    with open(os.path.join(workdir, MAIN), "w") as source:
        source.write(f'import {{ run }} from "{PRELUDE}";\nrun(async (tools) => {{\n{code}\n}});\n')
    # Deno reads local modules without read permission, dynamic imports included: every file URL but these
    # two leads nowhere.
    imports = {"file:///": "file:///nonexistent-module/", PRELUDE: PRELUDE, main: main}
    with open(os.path.join(workdir, "imports.json"), "w") as imports_file:
        imports_file.write(json.dumps({"imports": imports}))
    return {"DENO_DIR": os.path.join(workdir, "deno"), "DENO_NO_UPDATE_CHECK": "1", "NO_COLOR": "1", "PATH": ""}


def _cap_memory(pid: int, heap_mb: int) -> None:
    """The heap cap leaves ArrayBuffers out (their memory is not V8's heap): the process's data segment is
    capped too, at what Deno reserves to start plus the heap. Set before the code is sent, so it never
    runs uncapped."""
    limit = (DENO_START_MB + heap_mb) << 20
    try:
        resource.prlimit(pid, resource.RLIMIT_DATA, (limit, limit))
    except ProcessLookupError:
        pass  # it has already ended; its exit status says why


async def sandbox_run(*, code: str, bindings: Bindings, call: ToolCall, limits: SandboxLimits) -> SandboxRun:
    with tempfile.TemporaryDirectory(prefix="switchboard-code-") as workdir:
        environment = _prepare(workdir, code)
        process = await asyncio.create_subprocess_exec(
            *_deno_command(workdir, limits.heap_mb),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd=workdir,
            env=environment,
            limit=limits.max_output_bytes + 65_536,  # a longer line is refused as output over the cap
        )
        _cap_memory(process.pid, limits.heap_mb)
        conversation = _Conversation(process, bindings, call, limits)
        try:
            with anyio.fail_after(limits.timeout):
                return await conversation.run()
        except TimeoutError:
            message = f"The code ran longer than {limits.timeout:g} s; do less in one execution."
            raise SandboxError("SANDBOX_TIMEOUT", message, conversation.calls) from None
        finally:
            if process.returncode is None:
                process.kill()
            with anyio.CancelScope(shield=True):
                await process.wait()


class _Conversation:
    def __init__(self, process: Any, bindings: Bindings, call: ToolCall, limits: SandboxLimits) -> None:
        self.process, self.bindings, self.call, self.limits = process, bindings, call, limits
        self.result = SandboxRun()
        self.writing = asyncio.Lock()

    @property
    def calls(self) -> int:
        return self.result.calls

    async def run(self) -> SandboxRun:
        await self.send(self.bindings.tree())
        ended: SandboxError | None = None
        async with anyio.create_task_group() as tasks:
            try:
                while line := await self._line():
                    if self.take(line, tasks):
                        break
                else:
                    ended = await self._ended()
            except SandboxError as error:
                ended = error
            tasks.cancel_scope.cancel()  # calls still in flight are cancelled (and audited as such)
        if ended:
            raise ended
        return self.result

    async def _line(self) -> bytes:
        try:
            return await self.process.stdout.readline()
        except ValueError:  # asyncio's LimitOverrunError, surfaced by readline
            raise self.failure("SANDBOX_OUTPUT_LIMIT", self._over_output()) from None

    def take(self, line: bytes, tasks: anyio.abc.TaskGroup) -> bool:
        """Handle one message; True once the code has finished with a value."""
        try:
            message = json.loads(line)
        except ValueError:
            message = None
        if not isinstance(message, dict):  # raw writes to stdout: output like any other
            message = {"t": "log", "text": line.decode("utf-8", "replace").rstrip("\n")}
        kind = message.get("t")
        if kind == "call":
            self.result.calls += 1
            if self.result.calls > self.limits.max_calls:
                raise self.failure(
                    "SANDBOX_CALL_LIMIT",
                    f"The code made more than {self.limits.max_calls} tool calls; split the work across executions.",
                )
            tasks.start_soon(self.answer, message)
        elif kind == "done":
            self._count(json.dumps(message.get("value")))
            self.result.value = message.get("value")
            return True
        elif kind == "fail":
            code = f" ({message['code']})" if message.get("code") else ""  # an MCPToolError nobody caught
            text = f"{message.get('name', 'Error')}{code}: {message.get('message', '')}"
            raise self.failure("CODE_ERROR", text[:2000])
        else:
            text = str(message.get("text", ""))
            self._count(text)
            self.result.logs.append(text)
        return False

    def _count(self, text: str) -> None:
        self.result.output_bytes += len(text.encode("utf-8", "surrogatepass")) + 1
        if self.result.output_bytes > self.limits.max_output_bytes:
            raise self.failure("SANDBOX_OUTPUT_LIMIT", self._over_output())

    def _over_output(self) -> str:
        return (
            f"The code's output (its value and console lines) passed {self.limits.max_output_bytes} bytes; return less."
        )

    def failure(self, code: str, message: str) -> SandboxError:
        return SandboxError(code, message, self.result.calls)

    async def answer(self, message: dict[str, Any]) -> None:
        request_id, args = message.get("id"), message.get("args")
        binding = self.bindings.by_path.get((str(message.get("ns")), str(message.get("fn"))))
        if binding is None:
            answer = {"ok": False, "error": {"code": "TOOL_NOT_FOUND", "message": "No such tool in `tools`."}}
        elif not isinstance(args, dict):
            answer = {"ok": False, "error": {"code": "INVALID_ARGUMENTS", "message": "Arguments must be an object."}}
        else:
            answer = await self.call(binding, args)
        await self.send(answer | {"id": request_id})

    async def send(self, message: Any) -> None:
        async with self.writing:
            try:
                self.process.stdin.write(json.dumps(message).encode() + b"\n")
                await self.process.stdin.drain()
            except (BrokenPipeError, ConnectionResetError):
                pass  # the code has ended; its outcome is read from stdout and the exit status

    async def _ended(self) -> SandboxError:
        """Why the process ended without a value: the heap cap, code that would not compile, or an exit."""
        await self.process.wait()
        stderr = (await self.process.stderr.read(STDERR_KEPT * 4)).decode("utf-8", "replace")
        if "out of memory" in stderr or "heap limit" in stderr:
            return self.failure(
                "SANDBOX_MEMORY_LIMIT", f"The code used more than {self.limits.heap_mb} MB of heap; hold less at once."
            )
        if stderr.strip():
            return self.failure("CODE_ERROR", _code_position(stderr.strip())[:STDERR_KEPT])
        return self.failure("SANDBOX_EXITED", "The code ended the sandbox before returning a value.")


def _code_position(text: str) -> str:
    """Deno's message with the temporary file's URL turned into a line of the model's own code."""

    def line_of(found: re.Match[str]) -> str:
        return f"line {max(1, int(found.group(1)) - HEADER_LINES)}, column {found.group(2)}"

    text = "\n".join(line for line in text.splitlines() if not re.match(r"\s*\d*\s+\|", line))  # Deno's code frame
    return re.sub(r"(?:file://)?/\S*?/main\.ts:(\d+):(\d+)", line_of, text)
