// An MCP client on the TypeScript SDK, for the fault proxy's tests: it connects to the server a plan names
// (a command over stdio, or a streamable-HTTP URL), lists what the server offers, makes the plan's calls and
// prints one JSON object of everything it got. Usage: node mcp_client.mjs '<plan as JSON>', the plan
//   {"command": [COMMAND, ...ARGS] | "url": URL, "calls": [[TOOL, ARGUMENTS], ...],
//    "resources": [URI, ...], "prompts": [[NAME, ARGUMENTS], ...], "timeoutMs": N}
// Tool errors are results (isError); a failed request is {"requestError": message}.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const plan = JSON.parse(process.argv[2]);
const transport = plan.url
  ? new StreamableHTTPClientTransport(new URL(plan.url))
  : new StdioClientTransport({ command: plan.command[0], args: plan.command.slice(1), env: process.env });
const client = new Client({ name: "resilibench-ts-test-client", version: "1.0.0" });
const options = { timeout: plan.timeoutMs ?? 60000 };

async function attempt(request) {
  try {
    return await request();
  } catch (error) {
    return { requestError: String(error?.message ?? error) };
  }
}

await client.connect(transport);
const capabilities = client.getServerCapabilities() ?? {};
const out = {
  server: client.getServerVersion(),
  instructions: client.getInstructions() ?? null,
  capabilities,
  sessionId: transport.sessionId ?? null,
  tools: (await client.listTools(undefined, options)).tools,
  calls: [],
};
for (const [name, args] of plan.calls ?? []) {
  out.calls.push(await attempt(() => client.callTool({ name, arguments: args }, undefined, options)));
}
if (capabilities.resources) {
  out.resources = (await client.listResources(undefined, options)).resources;
  out.resourceTemplates = (await client.listResourceTemplates(undefined, options)).resourceTemplates;
  out.reads = [];
  for (const uri of plan.resources ?? []) out.reads.push(await attempt(() => client.readResource({ uri }, options)));
}
if (capabilities.prompts) {
  out.prompts = (await client.listPrompts(undefined, options)).prompts;
  out.gets = [];
  for (const [name, args] of plan.prompts ?? []) {
    out.gets.push(await attempt(() => client.getPrompt({ name, arguments: args }, options)));
  }
}
if (plan.url) await transport.terminateSession();
await client.close();
process.stdout.write(JSON.stringify(out) + "\n");
