// Drives `taskhost serve` with the official tasks requester
// (@modelcontextprotocol/ext-tasks on @modelcontextprotocol/client).
//
//   node ext_tasks.mjs v1-stdio <taskhost binary> <working dir>
//   node ext_tasks.mjs v1-http  <url> <token>
//   node ext_tasks.mjs v2-http  <url> <token>
//
// v1 is protocol 2025-11-25 (the client's default connection, experimental
// tasks); v2 is 2026-07-28 (the tasks extension). Calls the foreground
// `ticker` tool, which the server must answer with a task; follows the task
// to its end and reads its result. Prints one JSON line per step on stdout
// for the Rust test to check; exits non-zero on any failure.
import { Client, StreamableHTTPClientTransport } from "@modelcontextprotocol/client";
import { StdioClientTransport } from "@modelcontextprotocol/client/stdio";
import { createTaskSessionFromClient, resultFromTaskOutcome } from "@modelcontextprotocol/ext-tasks/client";

const [mode, target, extra] = process.argv.slice(2);
const report = (step, data) => console.log(JSON.stringify({ step, ...data }));
const clientInfo = { name: "ext-tasks-probe", version: "0.0.0" };

async function main() {
  const v2 = mode === "v2-http";
  const client = new Client(clientInfo, {
    capabilities: {},
    ...(v2 ? { versionNegotiation: { mode: { pin: "2026-07-28" } } } : {}),
  });
  let transport;
  if (mode === "v1-stdio") {
    transport = new StdioClientTransport({ command: target, args: ["serve"], cwd: extra, stderr: "inherit" });
  } else {
    transport = new StreamableHTTPClientTransport(new URL(target), {
      requestInit: { headers: { Authorization: `Bearer ${extra}` } },
    });
  }
  await client.connect(transport);
  report("connected", { era: client.getProtocolEra() ?? null, capabilities: client.getServerCapabilities() ?? null });

  let options = { endpointId: `taskhost-${mode}` };
  if (v2) {
    let next = 1;
    const framing = { protocolVersion: "2026-07-28", clientInfo, clientCapabilities: {} };
    const rawDispatch = async (request, dispatchOptions) => {
      const body = { jsonrpc: "2.0", id: `raw-${next++}`, ...request };
      // SEP-2243: routing headers mirror the method and its name-like param.
      const name = body.method === "tools/call" ? body.params?.name : body.params?.taskId;
      const response = await fetch(target, {
        method: "POST",
        headers: {
          Authorization: `Bearer ${extra}`,
          "Content-Type": "application/json",
          Accept: "application/json, text/event-stream",
          "MCP-Protocol-Version": framing.protocolVersion,
          // The 2026-07-28 HTTP transport names the method in a header too.
          "Mcp-Method": body.method,
          ...(typeof name === "string" ? { "Mcp-Name": name } : {}),
        },
        body: JSON.stringify(body),
        signal: dispatchOptions?.signal,
      });
      const answer = await response.json();
      return answer.error !== undefined ? { kind: "error", error: answer.error } : { kind: "result", result: answer.result };
    };
    options = { ...options, rawDispatch, v2RequestFraming: framing };
  }
  const session = createTaskSessionFromClient(client, options);
  try {
    // The server marks the tool `taskSupport: "optional"` (2025-11-25); a
    // requester that prefers tasks gets one.
    const execution = await session.callTool(
      "ticker",
      { count: 3, interval_ms: 100, message: "beat" },
      { task: { preference: "prefer" } },
    );
    report("called", { kind: execution.kind, taskId: execution.handle?.taskId ?? null });
    const { outcome } = await execution.settle();
    const result = resultFromTaskOutcome(outcome);
    report("settled", { state: outcome.kind ?? outcome.state ?? null, result });
  } finally {
    await session.close();
    await client.close();
  }
}

main().then(
  () => process.exit(0),
  (error) => {
    console.error(error?.stack ?? String(error));
    process.exit(1);
  },
);
