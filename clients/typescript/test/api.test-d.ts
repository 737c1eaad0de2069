// The package's API is the seed's declaration (seed 000, "Client side"), line by line.
import type { Room } from "livekit-client";
import { describe, expectTypeOf, it } from "vitest";
import {
  type AgentClient,
  AgentRefusedError,
  AgentUnavailableError,
  connectAgent,
  type EffectiveSettings,
  type SessionUpdate,
} from "curb/client";

// Copied from the seed, word for word.
interface SeedAgentClient {
  send(key: string, payload?: unknown): Promise<void>;
  ask<T = unknown>(key: string, payload?: unknown, opts?: { timeoutMs?: number }): Promise<T>;
  on(key: string, handler: (payload: unknown, meta: { id: string }) => void): () => void;
  update(settings: SessionUpdate): Promise<EffectiveSettings>;
  close(): void;
}
declare function seedConnectAgent(room: Room, options?: { agentIdentity?: string }): SeedAgentClient;

type SeedSessionUpdate = {
  tts?: { voice?: string | number; model?: string };
  stt?: { language?: string };
  llm?: { provider: "kugelaudio" | "anthropic" | "openai" | "openai-compatible"; model: string; baseURL?: string };
};

describe("curb/client", () => {
  it("declares connectAgent and AgentClient as the seed does", () => {
    expectTypeOf(connectAgent).toEqualTypeOf(seedConnectAgent);
    expectTypeOf<AgentClient>().toEqualTypeOf<SeedAgentClient>();
    expectTypeOf<AgentClient["ask"]>().toEqualTypeOf<SeedAgentClient["ask"]>();
  });

  it("has the seed's SessionUpdate, and the effective settings of its example answer", () => {
    expectTypeOf<SessionUpdate>().toEqualTypeOf<SeedSessionUpdate>();
    const answer = {
      tts: { provider: "kugelaudio", voice: 17 },
      stt: { provider: "azure", language: "de" },
      llm: { provider: "kugelaudio", model: "qwen3.8-27b" },
    };
    expectTypeOf(answer).toExtend<EffectiveSettings>();
    expectTypeOf<EffectiveSettings["tts"]["options"]>().toEqualTypeOf<{ [k: string]: unknown } | undefined>();
  });

  it("types ask's reply by its type argument", () => {
    const agent = connectAgent({} as Room);
    expectTypeOf(agent.ask<{ price: number }>("quote")).resolves.toEqualTypeOf<{ price: number }>();
    expectTypeOf(agent.ask("quote")).resolves.toBeUnknown();
  });

  it("has the seed's error classes: AgentRefusedError with code, issues and path", () => {
    expectTypeOf<AgentRefusedError>().toExtend<Error>();
    expectTypeOf<AgentRefusedError["code"]>().toExtend<string>();
    expectTypeOf<AgentRefusedError["path"]>().toEqualTypeOf<string | undefined>();
    expectTypeOf<AgentRefusedError["issues"]>().toEqualTypeOf<
      { path: (string | number)[]; message: string }[] | undefined
    >();
    expectTypeOf<AgentUnavailableError>().toExtend<Error>();
  });
});
