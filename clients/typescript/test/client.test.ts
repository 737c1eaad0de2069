// What needs no LiveKit server: argument checks, the 15 KiB rule, waiting for an agent, the
// mapping of RPC errors, one client per room. Each runs against a real (unconnected) Room; the
// Chromium end-to-end tests (tests/clients/) run the rest against a real server and agent.
import { Room, RpcError } from "livekit-client";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import * as curb from "curb/client";
import { AgentRefusedError, AgentUnavailableError, connectAgent } from "curb/client";
import { MAX_PAYLOAD_BYTES, toRefusal } from "../dist/client.js";

let room: Room;
beforeEach(() => {
  room = new Room();
});
afterEach(() => {
  vi.useRealTimers();
});

describe("the package", () => {
  it("exports the seed's values and nothing else", () => {
    expect(Object.keys(curb).sort()).toEqual(["AgentRefusedError", "AgentUnavailableError", "connectAgent"]);
  });
});

describe("one client per room", () => {
  it("refuses a second client until the first is closed", () => {
    const first = connectAgent(room);
    expect(() => connectAgent(room)).toThrow(/one agent client per room/);
    first.close();
    first.close(); // closing twice is harmless
    connectAgent(room).close();
  });

  it("refuses a room whose curb.message topic another handler holds", () => {
    room.registerTextStreamHandler("curb.message", () => {});
    expect(() => connectAgent(room)).toThrow(/curb\.message/);
  });

  it("takes no requests and no handlers once closed", async () => {
    const agent = connectAgent(room);
    agent.close();
    await expect(agent.send("ping")).rejects.toThrow("this agent client is closed");
    await expect(agent.update({ tts: { voice: 17 } })).rejects.toThrow("this agent client is closed");
    expect(() => agent.on("ping", () => {})).toThrow("this agent client is closed");
  });
});

describe("argument checks", () => {
  it("refuses a key that is not a non-empty string of at most 256 characters", async () => {
    const agent = connectAgent(room);
    await expect(agent.send("")).rejects.toThrow(TypeError);
    await expect(agent.ask("k".repeat(257))).rejects.toThrow(TypeError);
    await expect(agent.send(17 as unknown as string)).rejects.toThrow(TypeError);
    agent.close();
  });

  it("refuses a timeout that is not a positive number of milliseconds", async () => {
    const agent = connectAgent(room);
    for (const timeoutMs of [0, -5, Number.NaN, Number.POSITIVE_INFINITY]) {
      await expect(agent.ask("quote", {}, { timeoutMs })).rejects.toThrow(/timeoutMs/);
    }
    agent.close();
  });

  it("refuses settings that are not an object, and a handler that is not a function", async () => {
    const agent = connectAgent(room);
    await expect(agent.update(null as unknown as object)).rejects.toThrow(TypeError);
    expect(() => agent.on("show-form", "open" as unknown as () => void)).toThrow(TypeError);
    agent.close();
  });

  it("refuses a payload JSON cannot carry, before waiting for the agent", async () => {
    const agent = connectAgent(room);
    await expect(agent.send("n", { n: 10n })).rejects.toThrow(TypeError);
    agent.close();
  });
});

describe("the 15 KiB rule", () => {
  // {"key":"k","id":"<uuid>","payload":"<text>"}: what fills the request to exactly the cap.
  const overhead = JSON.stringify({ key: "k", id: crypto.randomUUID(), payload: "" }).length;

  it("is 15 KiB, LiveKit's RPC payload cap", () => {
    expect(MAX_PAYLOAD_BYTES).toBe(15_360);
  });

  it("refuses one byte over before anything is sent", async () => {
    const agent = connectAgent(room);
    const refused = agent.send("k", "x".repeat(MAX_PAYLOAD_BYTES - overhead + 1));
    await expect(refused).rejects.toBeInstanceOf(AgentRefusedError);
    await expect(refused).rejects.toMatchObject({ code: "payload_too_large", message: "payload_too_large" });
    agent.close();
  });

  it("counts UTF-8 bytes, not characters", async () => {
    const agent = connectAgent(room);
    const half = Math.ceil((MAX_PAYLOAD_BYTES - overhead + 1) / 2);
    await expect(agent.ask("k", "é".repeat(half))).rejects.toMatchObject({ code: "payload_too_large" });
    agent.close();
  });

  it("lets exactly 15 KiB through to wait for the agent", async () => {
    const agent = connectAgent(room);
    const full = agent.ask("k", "x".repeat(MAX_PAYLOAD_BYTES - overhead), { timeoutMs: 20 });
    await expect(full).rejects.toBeInstanceOf(AgentUnavailableError);
    agent.close();
  });

  it("applies to settings updates too", async () => {
    const agent = connectAgent(room);
    const model = "m".repeat(MAX_PAYLOAD_BYTES);
    await expect(agent.update({ tts: { model } })).rejects.toMatchObject({ code: "payload_too_large" });
    agent.close();
  });
});

describe("waiting for the agent", () => {
  it("rejects AgentUnavailableError after 10 s by default, not before", async () => {
    vi.useFakeTimers({ toFake: ["setTimeout", "clearTimeout", "performance"] });
    const agent = connectAgent(room);
    let outcome: unknown = "pending";
    agent.send("claim-submitted", { claimId: "C-17" }).catch((error: unknown) => {
      outcome = error;
    });
    await vi.advanceTimersByTimeAsync(9_999);
    expect(outcome).toBe("pending");
    await vi.advanceTimersByTimeAsync(1);
    expect(outcome).toBeInstanceOf(AgentUnavailableError);
    expect((outcome as Error).name).toBe("AgentUnavailableError");
    agent.close();
  });

  it("waits for ask's timeoutMs, for update the default", async () => {
    vi.useFakeTimers({ toFake: ["setTimeout", "clearTimeout", "performance"] });
    const agent = connectAgent(room);
    const outcomes: [string, unknown][] = [];
    agent.ask("quote", {}, { timeoutMs: 5_000 }).catch((error: unknown) => outcomes.push(["ask", error]));
    agent.update({ stt: { language: "de" } }).catch((error: unknown) => outcomes.push(["update", error]));
    await vi.advanceTimersByTimeAsync(5_000);
    expect(outcomes.map(([what]) => what)).toEqual(["ask"]);
    await vi.advanceTimersByTimeAsync(5_000);
    expect(outcomes.map(([what]) => what)).toEqual(["ask", "update"]);
    expect(outcomes.every(([, error]) => error instanceof AgentUnavailableError)).toBe(true);
    agent.close();
  });

  it("rejects a waiting request at once when the client is closed", async () => {
    const agent = connectAgent(room);
    const waiting = agent.send("claim-submitted", {});
    agent.close();
    await expect(waiting).rejects.toThrow("this agent client is closed");
  });

  it("leaves no timer behind once a wait ends", async () => {
    vi.useFakeTimers({ toFake: ["setTimeout", "clearTimeout", "performance"] });
    const agent = connectAgent(room);
    const waiting = agent.send("claim-submitted", {});
    agent.close();
    await expect(waiting).rejects.toThrow();
    expect(vi.getTimerCount()).toBe(0);
  });
});

describe("RPC errors", () => {
  it("an agent's refusal is AgentRefusedError with its code", () => {
    const refused = toRefusal(new RpcError(1500, "no_handler"));
    expect(refused).toBeInstanceOf(AgentRefusedError);
    expect(refused).toMatchObject({ name: "AgentRefusedError", code: "no_handler", message: "no_handler" });
    expect(refused).not.toHaveProperty("issues");
    expect(refused).not.toHaveProperty("path");
  });

  it("carries the path of not_adjustable", () => {
    const refused = toRefusal(new RpcError(1500, "not_adjustable", '{"path":"stt.language"}'));
    expect(refused).toMatchObject({ code: "not_adjustable", path: "stt.language" });
  });

  it("carries the issues of invalid_settings and invalid_payload", () => {
    const issues = [{ path: ["tts", "voice"], message: "a KugelAudio voice is a number" }];
    for (const code of ["invalid_settings", "invalid_payload"]) {
      const refused = toRefusal(new RpcError(1500, code, JSON.stringify({ issues })));
      expect(refused).toMatchObject({ code, issues });
    }
  });

  it("ignores details that are not JSON or not of the documented shape", () => {
    for (const data of ["not json", '{"issues":"many","path":3}', "[1]"]) {
      const refused = toRefusal(new RpcError(1500, "invalid_settings", data));
      expect(refused).toBeInstanceOf(AgentRefusedError);
      expect(refused).not.toHaveProperty("issues");
      expect(refused).not.toHaveProperty("path");
    }
  });

  it("a transport failure is LiveKit's own RpcError, unchanged", () => {
    for (const key of ["RESPONSE_TIMEOUT", "RECIPIENT_DISCONNECTED", "CONNECTION_TIMEOUT"] as const) {
      const error = RpcError.builtIn(key);
      expect(toRefusal(error)).toBe(error);
    }
    // An application error whose message is not a code (a handler that threw in another SDK).
    const other = new RpcError(1500, "Application error in method handler");
    expect(toRefusal(other)).toBe(other);
  });
});
