/**
 * Tools from MCP servers (`tasks[].tools.mcp`), reached with the official `@modelcontextprotocol/sdk`
 * client: a stdio server is a child process the worker spawns (`{ command, args }`), an HTTP one a
 * streamable-HTTP endpoint (`{ url }`). Their tools are listed into the episode's tools and the calls
 * to those names are routed to them (worker/tools.ts).
 *
 * Sessions (`tasks[].tools.mcpSessions`): `worker` — one connection per server per worker, shared by
 * every episode of the task (the default: a stdio server is not spawned per episode); `episode` — a
 * connection per episode, closed when it ends, for servers that keep per-session state.
 *
 * A server that dies (its process exits, its HTTP endpoint goes away) fails the calls in flight on it
 * with the reason — each is a tool error the model sees — and nothing else: the connection is dropped,
 * and the next call or listing connects again (a stdio server is started again).
 */
import type { Client } from '@modelcontextprotocol/sdk/client/index.js';
import type { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import type { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { loadOptional, OptionalPackageError, type OptionalImport } from '../optional-packages.ts';
import type { ToolOutput, ToolSchema } from './types.ts';

/** The parts of the SDK a connection uses. */
export interface McpSdk {
  Client: typeof Client;
  StdioClientTransport: typeof StdioClientTransport;
  StreamableHTTPClientTransport: typeof StreamableHTTPClientTransport;
}

/**
 * Imports the SDK, an optional dependency (src/optional-packages.ts): on the first connection, so a
 * worker whose tasks name no MCP server never loads it.
 */
export async function importMcpSdk(): Promise<McpSdk> {
  const [client, stdio, http] = await Promise.all([
    import('@modelcontextprotocol/sdk/client/index.js'),
    import('@modelcontextprotocol/sdk/client/stdio.js'),
    import('@modelcontextprotocol/sdk/client/streamableHttp.js'),
  ]);
  return {
    Client: client.Client,
    StdioClientTransport: stdio.StdioClientTransport,
    StreamableHTTPClientTransport: http.StreamableHTTPClientTransport,
  };
}

export type McpServerSpec =
  | { command: string; args: string[]; env?: Record<string, string>; cwd?: string }
  | { url: string; headers?: Record<string, string> };
export type McpSessions = 'worker' | 'episode';

/** The name this client introduces itself with (MCP `initialize`). */
const CLIENT_INFO = { name: 'rollout-engine', version: '1' };

/** How a server is named in results and logs: its URL, or its command line. */
export function mcpLabel(spec: McpServerSpec): string {
  return 'url' in spec ? spec.url : [spec.command, ...spec.args].join(' ');
}

/** One MCP server, connected on first use and again after it died. */
export class McpConnection {
  readonly label: string;
  readonly #spec: McpServerSpec;
  /** The live session; null before the first use and after the server closed it (the next use reconnects). */
  #client: Promise<Client> | null = null;
  /** Tools of the live session, listed once per connection. */
  #tools: Promise<ToolSchema[]> | null = null;
  /** Why the last session ended, kept for the calls it failed. */
  #lastClose: string | null = null;
  #closed = false;
  readonly #importSdk: OptionalImport<McpSdk>;

  /** `importSdk`: how the SDK is loaded (a test passes one that misses a package). */
  constructor(spec: McpServerSpec, importSdk: OptionalImport<McpSdk> = importMcpSdk) {
    this.#spec = spec;
    this.label = mcpLabel(spec);
    this.#importSdk = importSdk;
  }

  /** The server's tools as OpenAI function schemas. */
  tools(): Promise<ToolSchema[]> {
    return (this.#tools ??= this.#connect().then(async (client) => {
      const { tools } = await client.listTools();
      return tools.map((t) => ({
        type: 'function' as const,
        function: {
          name: t.name,
          ...(t.description ? { description: t.description } : {}),
          parameters: t.inputSchema as Record<string, unknown>,
        },
      }));
    })).catch((err: unknown) => {
      this.#tools = null; // listed again on the next use
      throw err;
    });
  }

  /** One call; a server error, an isError result or a dead server is an `{ isError: true }` output with the reason. */
  async call(name: string, args: Record<string, unknown>, signal: AbortSignal, timeoutMs: number): Promise<ToolOutput> {
    const client = await this.#connect();
    try {
      const result = await client.callTool({ name, arguments: args }, undefined, { signal, timeout: timeoutMs });
      const content = Array.isArray(result.content) ? result.content : [];
      const text = content
        .map((c: { type: string; text?: string }) => (c.type === 'text' ? (c.text ?? '') : JSON.stringify(c)))
        .join('\n');
      return {
        content:
          text === '' && result.structuredContent !== undefined ? JSON.stringify(result.structuredContent) : text,
        isError: result.isError === true,
      };
    } catch (err) {
      if (signal.aborted) throw err; // timed out or cancelled: the caller says which
      const why =
        this.#lastClose !== null && /closed/i.test((err as Error).message)
          ? `${(err as Error).message}: ${this.#lastClose}`
          : (err as Error).message;
      return { content: `MCP server ${this.label}: ${why}`, isError: true };
    }
  }

  async close(): Promise<void> {
    this.#closed = true;
    const client = this.#client;
    this.#client = null;
    this.#tools = null;
    if (client !== null) await client.then((c) => c.close()).catch(() => undefined);
  }

  #connect(): Promise<Client> {
    if (this.#closed) return Promise.reject(new Error(`MCP server ${this.label}: the connection was closed`));
    if (this.#client !== null) return this.#client;
    const spec = this.#spec;
    const connecting: Promise<Client> = loadOptional('mcp', this.#importSdk).then(async (sdk) => {
      const client = new sdk.Client(CLIENT_INFO);
      const transport =
        'url' in spec
          ? new sdk.StreamableHTTPClientTransport(
              new URL(spec.url),
              spec.headers ? { requestInit: { headers: spec.headers } } : undefined,
            )
          : new sdk.StdioClientTransport({
              command: spec.command,
              args: spec.args,
              ...(spec.env ? { env: spec.env } : {}),
              ...(spec.cwd ? { cwd: spec.cwd } : {}),
              stderr: 'ignore',
            });
      let lastError: string | null = null;
      client.onerror = (err) => {
        lastError = err.message;
      };
      // The session ended (the server died, or close()): calls in flight fail with this reason, and the
      // next use starts a new one. Only this session's end: a newer one may already be connecting.
      client.onclose = () => {
        this.#lastClose =
          lastError === null ? 'the server closed the connection' : `the server closed the connection (${lastError})`;
        if (this.#client === connecting) {
          this.#client = null;
          this.#tools = null;
        }
      };
      await client.connect(transport);
      return client;
    });
    this.#client = connecting;
    connecting.catch(() => {
      if (this.#client === connecting) {
        this.#client = null;
        this.#tools = null;
      }
    });
    return connecting.catch((err: unknown) => {
      // A missing SDK says so in one line (the feature, the package, the install command).
      if (err instanceof OptionalPackageError) throw err;
      throw new Error(`MCP server ${this.label}: cannot connect: ${(err as Error).message}`, { cause: err });
    });
  }
}

/** A task's MCP servers: their tools, and which server owns each name (the first one listing it). */
export class McpServers {
  readonly connections: McpConnection[];

  constructor(specs: readonly McpServerSpec[], importSdk: OptionalImport<McpSdk> = importMcpSdk) {
    this.connections = specs.map((spec) => new McpConnection(spec, importSdk));
  }

  /** Every server's tools, with the connection that serves each name; a server that cannot be reached lists none (`problems` says why). */
  async list(): Promise<{ schemas: ToolSchema[]; owners: Map<string, McpConnection>; problems: string[] }> {
    const listed = await Promise.allSettled(this.connections.map((c) => c.tools()));
    const schemas: ToolSchema[] = [];
    const owners = new Map<string, McpConnection>();
    const problems: string[] = [];
    listed.forEach((result, i) => {
      if (result.status === 'rejected') {
        problems.push((result.reason as Error).message);
        return;
      }
      for (const schema of result.value) {
        if (owners.has(schema.function.name)) continue;
        owners.set(schema.function.name, this.connections[i]);
        schemas.push(schema);
      }
    });
    return { schemas, owners, problems };
  }

  async close(): Promise<void> {
    await Promise.all(this.connections.map((c) => c.close()));
  }
}
