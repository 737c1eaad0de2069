// curb/client: the app's side of a curb-runner agent in a LiveKit room (seed 000, "Client side").
export {
  type AgentClient,
  AgentRefusedError,
  AgentUnavailableError,
  connectAgent,
  type Issue,
  type RefusalCode,
} from "./client.js";
export type { EffectiveSettings, SessionUpdate } from "./protocol.js";
