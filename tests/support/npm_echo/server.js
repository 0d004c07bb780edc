#!/usr/bin/env node
// A stdio MCP server with no dependencies, packed by tests/support/npm_package.py as an npm package: its tool
// `version` says the package version it runs and the script's path, so a test sees which install serves it.
const readline = require("readline");
const manifest = require("./package.json");

function answer(id, result) {
  process.stdout.write(JSON.stringify({ jsonrpc: "2.0", id, result }) + "\n");
}

readline.createInterface({ input: process.stdin }).on("line", (line) => {
  const message = JSON.parse(line);
  if (message.id === undefined) return; // a notification
  if (message.method === "initialize") {
    answer(message.id, {
      protocolVersion: message.params.protocolVersion,
      capabilities: { tools: {} },
      serverInfo: { name: manifest.name, version: manifest.version },
    });
  } else if (message.method === "tools/list") {
    answer(message.id, { tools: [{ name: "version", description: "Its version.", inputSchema: { type: "object" } }] });
  } else if (message.method === "tools/call") {
    const said = JSON.stringify({ version: manifest.version, script: __filename });
    answer(message.id, { content: [{ type: "text", text: said }] });
  } else if (message.method === "ping") {
    answer(message.id, {});
  } else {
    const error = { code: -32601, message: `Method not found: ${message.method}` };
    process.stdout.write(JSON.stringify({ jsonrpc: "2.0", id: message.id, error }) + "\n");
  }
});
