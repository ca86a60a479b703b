// Call `qmdbridge serve` from Node.js (>= 18): start it once, then send tool calls as JSON lines.
//
// No dependencies. The protocol is described in docs/serve-protocol.md.
//
//   node examples/serve_client.mjs --workspace examples/workspace "router dropped the WAN link"

import { spawn } from "node:child_process";
import { createInterface } from "node:readline";

export class ServeClient {
  /** Start `qmdbridge serve --no-socket ...args` (QMDBRIDGE_CMD overrides the command). */
  constructor(args = [], command = process.env.QMDBRIDGE_CMD ?? "qmdbridge") {
    this.proc = spawn(command, ["serve", "--no-socket", ...args], { stdio: ["pipe", "pipe", "pipe"] });
    this.nextId = 1;
    this.pending = new Map(); // id -> { resolve, reject }
    this.log = [];
    this.ready = new Promise((resolve, reject) => {
      createInterface({ input: this.proc.stderr }).on("line", (line) => {
        this.log.push(line);
        if (line.startsWith("qmdbridge serve: agent ")) resolve();
      });
      this.proc.on("exit", (code) => reject(new Error(`qmdbridge serve exited ${code}: ${this.log.slice(-3).join("\n")}`)));
    });
    createInterface({ input: this.proc.stdout }).on("line", (line) => {
      const reply = JSON.parse(line);
      const waiter = this.pending.get(reply.id);
      if (!waiter) return; // a protocol error with id null: nothing of ours is waiting for it
      this.pending.delete(reply.id);
      if ("error" in reply) waiter.reject(new Error(reply.error));
      else waiter.resolve(reply.result);
    });
  }

  /** Send one request; resolves with its `result`, rejects on a protocol `error`. */
  call(tool, params = {}, sessionKey = null) {
    const id = this.nextId++;
    const done = new Promise((resolve, reject) => this.pending.set(id, { resolve, reject }));
    this.proc.stdin.write(JSON.stringify({ id, tool, params, sessionKey }) + "\n");
    return done;
  }

  /** Close stdin (the server stops at end of input); resolves with the exit code. */
  close() {
    return new Promise((resolve) => {
      this.proc.on("close", (code) => resolve(code));
      this.proc.stdin.end();
    });
  }
}

async function main(argv) {
  const at = argv.indexOf("--workspace");
  if (at < 0 || at + 1 >= argv.length) {
    console.error("usage: node serve_client.mjs --workspace DIR QUERY");
    return 2;
  }
  const workspace = argv[at + 1];
  const query = argv.filter((_, i) => i !== at && i !== at + 1).join(" ");
  const client = new ServeClient(["--workspace", workspace]);
  try {
    await client.ready;
    const found = await client.call("memory_search", { query, maxResults: 3 }, "agent:main:main");
    if (found.disabled) {
      console.log(`search failed: ${found.error}`);
      return 1;
    }
    for (const hit of found.results) console.log(`${hit.score.toFixed(3)} ${hit.citation}`);
    if (found.results.length) {
      const first = found.results[0];
      const page = await client.call("memory_get", { path: first.path, from: first.startLine, lines: 3 });
      console.log(page.text);
    }
    return 0;
  } finally {
    await client.close();
  }
}

if (import.meta.url === `file://${process.argv[1]}`) {
  process.exitCode = await main(process.argv.slice(2));
}
