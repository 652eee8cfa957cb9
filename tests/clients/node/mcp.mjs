// Real-client driver for agentd's MCP server with the official TypeScript SDK
// (@modelcontextprotocol/sdk, pinned in package-lock.json), over streamable HTTP.
//
// Usage:  node tests/clients/node/mcp.mjs <scenario>
// Env:    AGENTD_MCP_URL (…/mcp or …/apps/APP/mcp), AGENTD_TOOL (the app to call).
//
// Scenarios:
//   call      listTools: tools (names); callTool: text, isError, status, sessionId
//   progress  callTool with onprogress: progress (count), progressText, text
//   cancel    callTool aborted (AbortSignal) after the first progress notification (the
//             SDK sends notifications/cancelled): aborted (the error's name)
//
// Output: exactly one line of JSON on stdout ({"scenario", ...observations, "error"?}).

import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';

const scenario = process.argv[2];
const url = new URL(process.env.AGENTD_MCP_URL);
const tool = process.env.AGENTD_TOOL;
const out = { scenario };
const textOf = (r) => (r.content ?? []).filter((c) => c.type === 'text').map((c) => c.text).join('');

async function main() {
  const client = new Client({ name: 'agentd-test', version: '1.0.0' });
  const transport = new StreamableHTTPClientTransport(url);
  await client.connect(transport);
  out.protocol = transport.protocolVersion ?? null;
  out.sessionId = transport.sessionId ?? null;
  if (scenario === 'call') {
    out.tools = (await client.listTools()).tools.map((t) => t.name);
    const r = await client.callTool({ name: tool, arguments: { message: 'hello' } });
    Object.assign(out, { text: textOf(r), isError: r.isError, status: r.structuredContent?.status });
  } else if (scenario === 'progress') {
    const seen = [];
    const r = await client.callTool({ name: tool, arguments: { message: 'hello' } }, undefined, {
      onprogress: (p) => seen.push(p),
    });
    Object.assign(out, {
      progress: seen.length,
      progressText: seen.map((p) => p.message ?? '').join(''),
      text: textOf(r),
    });
  } else if (scenario === 'cancel') {
    const abort = new AbortController();
    try {
      await client.callTool({ name: tool, arguments: { message: 'hello' } }, undefined, {
        signal: abort.signal,
        onprogress: () => abort.abort('enough'),
      });
      out.aborted = null;
    } catch (e) {
      out.aborted = e?.name ?? String(e);
    }
    // Let the cancel notification go out before the process ends.
    await new Promise((r) => setTimeout(r, 500));
  } else {
    throw new Error(`unknown scenario ${scenario}`);
  }
  await client.close();
}

const timer = setTimeout(() => { out.error = 'timeout'; console.log(JSON.stringify(out)); process.exit(0); }, 60000);
main()
  .catch((e) => { out.error = `${e?.constructor?.name}: ${e?.message ?? e}`; })
  .finally(() => { clearTimeout(timer); console.log(JSON.stringify(out)); process.exit(0); });
