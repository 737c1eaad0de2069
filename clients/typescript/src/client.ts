import { type Participant, type Room, RoomEvent, RpcError, type TextStreamReader } from "livekit-client";
import type { EffectiveSettings, SessionUpdate } from "./protocol.js";

/** The RPC method and text-stream topic of app messages; `curb.update` changes live settings. */
export const TOPIC = "curb.message";
export const UPDATE_METHOD = "curb.update";
/** LiveKit's RPC payload cap, in UTF-8 bytes. */
export const MAX_PAYLOAD_BYTES = 15 * 1024;
export const DEFAULT_TIMEOUT_MS = 10_000;
export const MAX_KEY_LENGTH = 256;
const REFUSAL_RPC_CODE = 1500;
const CODE = /^[a-z][a-z_]*$/;

/** The codes an agent refuses a request with (seed 000, "Client side"). */
export type RefusalCode =
  | "no_handler"
  | "invalid_payload"
  | "handler_failed"
  | "not_adjustable"
  | "invalid_settings"
  | "payload_too_large"
  | "invalid_request"
  | (string & {});

/** One schema issue the agent found: where in the value, and what is wrong there. */
export interface Issue {
  path: (string | number)[];
  message: string;
}

/** The agent refused a request; nothing it would have changed has changed. */
export class AgentRefusedError extends Error {
  override name = "AgentRefusedError";
  readonly code: RefusalCode;
  /** What did not fit, for `invalid_payload` and `invalid_settings`. */
  declare readonly issues?: Issue[];
  /** The first path that is not adjustable, for `not_adjustable`. */
  declare readonly path?: string;

  constructor(code: RefusalCode, details: { issues?: Issue[]; path?: string } = {}) {
    super(code);
    this.code = code;
    if (details.issues !== undefined) this.issues = details.issues;
    if (details.path !== undefined) this.path = details.path;
  }
}

/** No agent joined the room within the request's timeout. */
export class AgentUnavailableError extends Error {
  override name = "AgentUnavailableError";
}

export interface AgentClient {
  send(key: string, payload?: unknown): Promise<void>;
  ask<T = unknown>(key: string, payload?: unknown, opts?: { timeoutMs?: number }): Promise<T>;
  on(key: string, handler: (payload: unknown, meta: { id: string }) => void): () => void;
  update(settings: SessionUpdate): Promise<EffectiveSettings>;
  close(): void;
}

type Handler = (payload: unknown, meta: { id: string }) => void;

const encoder = new TextEncoder();

class RoomAgentClient implements AgentClient {
  readonly #room: Room;
  readonly #agentIdentity: string | undefined;
  readonly #handlers = new Map<string, Set<Handler>>();
  readonly #warned = new Set<string>();
  readonly #waiters = new Set<(timedOut?: boolean) => void>();
  #closed = false;

  constructor(room: Room, agentIdentity: string | undefined) {
    this.#room = room;
    this.#agentIdentity = agentIdentity;
    try {
      room.registerTextStreamHandler(TOPIC, (reader, sender) => this.#onText(reader, sender.identity));
    } catch (error) {
      throw new Error(
        `this room already has a handler for the "${TOPIC}" text stream (one agent client per room: ` +
          "close() the other first)",
        { cause: error },
      );
    }
    room.on(RoomEvent.ParticipantConnected, this.#wake);
    room.on(RoomEvent.Connected, this.#wake);
  }

  async send(key: string, payload?: unknown): Promise<void> {
    await this.ask(key, payload);
  }

  async ask<T = unknown>(key: string, payload?: unknown, opts?: { timeoutMs?: number }): Promise<T> {
    if (typeof key !== "string" || key.length === 0 || key.length > MAX_KEY_LENGTH) {
      throw new TypeError(`a message key is a non-empty string of at most ${MAX_KEY_LENGTH} characters`);
    }
    const body = { key, id: crypto.randomUUID(), payload: payload ?? null };
    const answer = await this.#request(TOPIC, body, opts?.timeoutMs);
    return (isObject(answer) ? answer.reply : undefined) as T;
  }

  async update(settings: SessionUpdate): Promise<EffectiveSettings> {
    if (!isObject(settings)) throw new TypeError("settings is an object (a SessionUpdate)");
    const answer = await this.#request(UPDATE_METHOD, settings, undefined);
    if (!isObject(answer)) throw new AgentRefusedError("invalid_response");
    return answer as unknown as EffectiveSettings;
  }

  on(key: string, handler: Handler): () => void {
    this.#checkOpen();
    if (typeof handler !== "function") throw new TypeError("handler is a function");
    let handlers = this.#handlers.get(key);
    if (handlers === undefined) this.#handlers.set(key, (handlers = new Set()));
    // A handler added twice is called twice; each unsubscribe removes its own.
    const own: Handler = (payload, meta) => handler(payload, meta);
    handlers.add(own);
    return () => {
      handlers.delete(own);
    };
  }

  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    this.#handlers.clear();
    this.#room.unregisterTextStreamHandler(TOPIC);
    this.#room.off(RoomEvent.ParticipantConnected, this.#wake);
    this.#room.off(RoomEvent.Connected, this.#wake);
    this.#wake();
  }

  // -- Requests -------------------------------------------------------------------------------

  async #request(method: string, body: unknown, timeoutMs: number | undefined): Promise<unknown> {
    const timeout = timeoutMs ?? DEFAULT_TIMEOUT_MS;
    if (typeof timeout !== "number" || !(timeout > 0) || !Number.isFinite(timeout)) {
      throw new TypeError("timeoutMs is a positive number of milliseconds");
    }
    this.#checkOpen();
    const payload = JSON.stringify(body);
    if (encoder.encode(payload).length > MAX_PAYLOAD_BYTES) throw new AgentRefusedError("payload_too_large");
    const deadline = performance.now() + timeout;
    const identity = await this.#waitAgent(deadline, timeout);
    let response: string;
    try {
      response = await this.#room.localParticipant.performRpc({
        destinationIdentity: identity,
        method,
        payload,
        responseTimeout: Math.max(1, Math.round(deadline - performance.now())),
      });
    } catch (error) {
      throw error instanceof RpcError ? toRefusal(error) : error;
    }
    return response ? JSON.parse(response) : null;
  }

  // -- The agent ------------------------------------------------------------------------------

  /** The agent's identity once it is in the room: the one named, else the first AGENT. */
  #findAgent(): string | undefined {
    const participants = this.#room.remoteParticipants;
    if (this.#agentIdentity !== undefined) {
      return participants.has(this.#agentIdentity) ? this.#agentIdentity : undefined;
    }
    for (const participant of participants.values()) {
      if (participant.isAgent) return participant.identity;
    }
    return undefined;
  }

  #waitAgent(deadline: number, timeout: number): Promise<string> {
    return new Promise((resolve, reject) => {
      // Checked now, on every join, and once more when the time is up.
      const check = (timedOut = false): void => {
        const identity = this.#closed ? undefined : this.#findAgent();
        if (identity !== undefined) resolve(identity);
        else if (this.#closed) reject(new Error("this agent client is closed"));
        else if (timedOut) reject(new AgentUnavailableError(`no agent joined the room within ${timeout} ms`));
        else return;
        clearTimeout(timer);
        this.#waiters.delete(check);
      };
      const timer = setTimeout(() => check(true), Math.max(0, deadline - performance.now()));
      this.#waiters.add(check);
      check();
    });
  }

  readonly #wake = (): void => {
    for (const check of [...this.#waiters]) check();
  };

  // -- Messages from the agent ----------------------------------------------------------------

  #fromAgent(sender: string): boolean {
    if (this.#agentIdentity !== undefined) return sender === this.#agentIdentity;
    const participant: Participant | undefined = this.#room.remoteParticipants.get(sender);
    return participant?.isAgent === true;
  }

  #onText(reader: TextStreamReader, sender: string): void {
    if (this.#closed || !this.#fromAgent(sender)) return;
    void this.#read(reader);
  }

  async #read(reader: TextStreamReader): Promise<void> {
    let key: string;
    let payload: unknown;
    try {
      const message: unknown = JSON.parse(await reader.readAll());
      if (!isObject(message) || typeof message.key !== "string") throw new TypeError("no key");
      key = message.key;
      payload = message.payload ?? null;
    } catch (error) {
      console.warn(`curb/client: a malformed ${TOPIC} from the agent was dropped:`, error);
      return;
    }
    if (this.#closed) return;
    const handlers = [...(this.#handlers.get(key) ?? [])];
    if (handlers.length === 0) {
      if (!this.#warned.has(key)) {
        this.#warned.add(key);
        console.warn(`curb/client: no handler for the agent's message "${key}"; dropped`);
      }
      return;
    }
    const meta = { id: reader.info.id };
    for (const handler of handlers) {
      try {
        const result: unknown = handler(payload, meta);
        if (result instanceof Promise) result.catch((error: unknown) => reportHandlerError(key, error));
      } catch (error) {
        reportHandlerError(key, error);
      }
    }
  }

  #checkOpen(): void {
    if (this.#closed) throw new Error("this agent client is closed");
  }
}

function reportHandlerError(key: string, error: unknown): void {
  console.error(`curb/client: the handler of the agent's message "${key}" failed:`, error);
}

function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

/** An agent's refusal (RPC error 1500 whose message is a code) as AgentRefusedError; any other
 *  RpcError (a timeout, a disconnect) is LiveKit's own and is returned as it is. */
export function toRefusal(error: RpcError): Error {
  if (error.code !== REFUSAL_RPC_CODE || !CODE.test(error.message)) return error;
  const details: { issues?: Issue[]; path?: string } = {};
  let data: unknown;
  try {
    data = error.data ? JSON.parse(error.data) : undefined;
  } catch {
    data = undefined;
  }
  if (isObject(data)) {
    if (Array.isArray(data.issues)) details.issues = data.issues as Issue[];
    if (typeof data.path === "string") details.path = data.path;
  }
  return new AgentRefusedError(error.message, details);
}

/**
 * The agent of `room`: `options.agentIdentity`, else the first remote participant of kind AGENT.
 *
 * One client per room (LiveKit takes one handler per text-stream topic): `close()` it when the
 * app is done with the room, for example when its component unmounts.
 *
 * @throws Error when the room already has a `curb.message` text-stream handler.
 */
export function connectAgent(room: Room, options?: { agentIdentity?: string }): AgentClient {
  return new RoomAgentClient(room, options?.agentIdentity);
}
