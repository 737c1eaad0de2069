// The test page: a Room of its own, and window.e2e for tests/livekit/lk_browser.py to drive.
// Each request answers {value, elapsedMs} or, when it rejects, what the app would see of the
// error ({failed: its class, code, issues, path, rpcCode, message, elapsedMs}).
import { Room, RpcError } from "livekit-client";
import { type AgentClient, AgentRefusedError, AgentUnavailableError, connectAgent } from "curb/client";
import { talkToAgent } from "./seed-client.js";
import { talkToAgent as talkWithLivekitClientAlone } from "./seed-livekit-client.js";

type Json = Record<string, unknown>;

declare global {
  interface Window {
    e2e: typeof e2e;
    curbEmit(event: Json): Promise<void>;
  }
}

const room = new Room();
let agent: AgentClient | undefined;
const unsubscribe = new Map<string, () => void>();
let closeSeedExample: (() => void) | undefined;

function emit(event: Json): void {
  void window.curbEmit(event);
}

function describeError(error: unknown): Json {
  if (error instanceof AgentRefusedError) {
    return { failed: "AgentRefusedError", name: error.name, code: error.code, issues: error.issues ?? null, path: error.path ?? null, message: error.message };
  }
  if (error instanceof AgentUnavailableError) return { failed: "AgentUnavailableError", name: error.name, message: error.message };
  if (error instanceof RpcError) return { failed: "RpcError", rpcCode: error.code, message: error.message };
  if (error instanceof Error) return { failed: error.name, message: error.message };
  return { failed: String(error) };
}

async function outcome(request: () => Promise<unknown> | unknown): Promise<Json> {
  const started = performance.now();
  try {
    const value = await request();
    return { value: value ?? null, elapsedMs: performance.now() - started };
  } catch (error) {
    return { ...describeError(error), elapsedMs: performance.now() - started };
  }
}

function client(): AgentClient {
  if (agent === undefined) throw new Error("call connectAgent first");
  return agent;
}

const e2e = {
  async connect(url: string, token: string): Promise<Json> {
    await room.connect(url, token);
    return { identity: room.localParticipant.identity };
  },
  connectAgent: (agentIdentity?: string) =>
    outcome(() => {
      agent = connectAgent(room, agentIdentity === undefined ? undefined : { agentIdentity });
    }),
  on(key: string): void {
    unsubscribe.set(
      key,
      client().on(key, (payload, meta) => emit({ event: "agent_message", key, payload, id: meta.id })),
    );
  },
  off(key: string): void {
    unsubscribe.get(key)?.();
  },
  send: (key: string, payload?: unknown) => outcome(() => client().send(key, payload)),
  ask: (key: string, payload?: unknown, timeoutMs?: number) =>
    outcome(() => client().ask(key, payload, timeoutMs === undefined ? undefined : { timeoutMs })),
  update: (settings: Json) => outcome(() => client().update(settings)),
  close(): void {
    client().close();
  },
  seedExample: () =>
    outcome(async () => {
      const { quote, voiceChangeable, close } = await talkToAgent(room, (form) => emit({ event: "form", form }));
      closeSeedExample = close;
      return { quote, voiceChangeable };
    }),
  closeSeedExample(): void {
    closeSeedExample?.();
  },
  livekitClientAlone: () =>
    outcome(() =>
      talkWithLivekitClientAlone(room, (form) => emit({ event: "form", via: "livekit-client", form })),
    ),
};

window.e2e = e2e;
