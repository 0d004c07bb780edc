// The sandbox's side of code mode. The model's code runs in this Deno process with no permissions at all;
// each tool call is a JSON line on stdout, answered by a JSON line on stdin. The host checks every message:
// nothing here is trusted, this file only makes the protocol pleasant to use.

type Answer = { id: number; ok: boolean; value?: unknown; error?: { code: string; message: string } };
type Tree = Record<string, Record<string, string>>;

const encoder = new TextEncoder();
const pending = new Map<number, { resolve: (v: unknown) => void; reject: (e: unknown) => void }>();
let nextId = 0;

function send(message: unknown): void {
  const bytes = encoder.encode(JSON.stringify(message) + "\n");
  for (let written = 0; written < bytes.length; ) written += Deno.stdout.writeSync(bytes.subarray(written));
}

class MCPToolError extends Error {
  readonly tool: string;
  readonly code: string;
  constructor(tool: string, code: string, message: string) {
    super(message);
    this.name = "MCPToolError";
    this.tool = tool;
    this.code = code;
  }
}

function bind(tree: Tree): unknown {
  const tools = Object.create(null);
  for (const [namespace, methods] of Object.entries(tree)) {
    const object = Object.create(null);
    for (const [method, name] of Object.entries(methods)) {
      const call = (args?: unknown) =>
        new Promise((resolve, reject) => {
          const id = nextId++;
          pending.set(id, { resolve, reject: (e) => reject(e) });
          send({ t: "call", id, ns: namespace, fn: method, args: args ?? {} });
        }).catch((e: { code: string; message: string }) => {
          throw new MCPToolError(name, e.code, e.message);
        });
      Object.defineProperty(object, method, { value: call, enumerable: true });
    }
    Object.defineProperty(tools, namespace, { value: Object.freeze(object), enumerable: true });
  }
  return Object.freeze(tools);
}

function show(value: unknown): string {
  return typeof value === "string" ? value : Deno.inspect(value, { depth: 4 });
}

async function* lines(): AsyncGenerator<string> {
  const decoder = new TextDecoder();
  let buffer = "";
  for await (const chunk of Deno.stdin.readable) {
    buffer += decoder.decode(chunk, { stream: true });
    let end;
    while ((end = buffer.indexOf("\n")) >= 0) {
      yield buffer.slice(0, end);
      buffer = buffer.slice(end + 1);
    }
  }
}

// Prototype pollution fails loudly: the built-in prototypes are sealed before the model's code runs (no
// property can be added or removed). Sealed, not frozen: a frozen Error.prototype makes every `this.name =`
// of an error subclass throw, Deno's own errors included.
function sealIntrinsics(): void {
  const intrinsics = [Object, Array, Function, String, Number, Boolean, Symbol, BigInt, Promise, RegExp, Date];
  const more = [Map, Set, WeakMap, WeakSet, Error, TypeError, RangeError, SyntaxError, ArrayBuffer, Uint8Array];
  const functions = [(async () => {}).constructor, function* () {}.constructor, async function* () {}.constructor];
  for (const intrinsic of [...intrinsics, ...more, ...functions, JSON, Math, Reflect, MCPToolError]) {
    Object.seal(intrinsic);
    if ("prototype" in intrinsic) Object.seal(intrinsic.prototype);
  }
}

export async function run(main: (tools: any) => Promise<unknown>): Promise<void> {
  const input = lines();
  const first = await input.next();
  const tools = bind(JSON.parse(first.value ?? "{}"));
  for (const level of ["log", "info", "warn", "error", "debug"] as const) {
    console[level] = (...args: unknown[]) => send({ t: "log", text: args.map(show).join(" ") });
  }
  (async () => {
    for await (const line of input) {
      const answer: Answer = JSON.parse(line);
      const waiting = pending.get(answer.id);
      pending.delete(answer.id);
      if (answer.ok) waiting?.resolve(answer.value);
      else waiting?.reject(answer.error);
    }
  })();
  Object.defineProperty(globalThis, "MCPToolError", { value: MCPToolError });
  sealIntrinsics();
  try {
    const value = await main(tools);
    send({ t: "done", value: value === undefined ? null : value });
  } catch (error) {
    const e = error instanceof Error ? error : new Error(show(error));
    send({ t: "fail", name: e.name, message: e.message, code: (e as MCPToolError).code ?? "" });
  }
  Deno.exit(0);
}
