// The playground of `runner dev`: the agent over the ino.v2 socket, and its call's journal.
// Plain JavaScript, no build step. `window.playground` is its state, read by the browser tests.
"use strict";

const $ = (id) => document.getElementById(id);
// Codes after which reconnecting cannot help (the page of the protocol says which).
const FINAL_CODES = new Set([4002, 4004, 4008, 4010]);
const MIC_RATE = 16000;

const state = {
  session: null, // {token, session_id, agent}
  ws: null,
  ready: false,
  busy: false,
  turns: {}, // turn id -> its reply's <li>
  tools: {}, // call id -> its <li>
  rate: 24000,
  speaker: null,
  playAt: 0,
  playing: new Set(),
  played: 0, // seconds of the agent's voice played so far
  heard: [], // what the recognizer heard, turn by turn
  replies: [], // every finished reply's text
  mic: null,
  reconnects: 0,
  records: 0,
};
window.playground = state;

function scrollDown(list) {
  list.scrollTop = list.scrollHeight;
}

function line(kind, text) {
  const li = document.createElement("li");
  li.className = kind;
  li.textContent = text;
  $("transcript").append(li);
  scrollDown($("transcript"));
  return li;
}

function setStatus(kind, text) {
  $("status").dataset.state = kind;
  $("status").textContent = text;
}

function send(frame) {
  if (state.ws && state.ws.readyState === WebSocket.OPEN) state.ws.send(JSON.stringify(frame));
}

// -- the conversation ------------------------------------------------------------------------

function reply(turn) {
  if (!state.turns[turn]) {
    const li = line("agent", "");
    li.dataset.turn = turn;
    li.append(document.createTextNode(""));
    state.turns[turn] = li;
  }
  return state.turns[turn];
}

function onFrame(frame) {
  switch (frame.type) {
    case "ready":
      state.ready = true;
      state.busy = frame.greeting;
      state.rate = frame.audio.sample_rate;
      state.reconnects = 0;
      setStatus("ready", frame.speaks ? "connected · speaks" : "connected · text only");
      loadSettings();
      break;
    case "turn.start":
      state.busy = true;
      break;
    case "heard":
      state.heard.push(frame.text);
      line("user spoken", frame.text || "(nothing heard)").dataset.turn = frame.turn;
      break;
    case "text.delta":
      reply(frame.turn).firstChild.textContent += frame.text;
      scrollDown($("transcript"));
      break;
    case "mood": {
      const li = reply(frame.turn);
      let tag = li.querySelector(".mood");
      if (!tag) {
        tag = document.createElement("span");
        tag.className = "mood";
        li.append(tag);
      }
      tag.textContent = frame.intensity == null ? frame.mood : `${frame.mood} ${frame.intensity}`;
      break;
    }
    case "tool.start": {
      const li = line("tool", `⚙ ${frame.name} …`);
      state.tools[frame.call_id || `${frame.turn}:${frame.name}`] = li;
      break;
    }
    case "tool.end": {
      const li = state.tools[frame.call_id || `${frame.turn}:${frame.name}`];
      if (li) li.textContent = `⚙ ${frame.name} ${frame.ok ? "ok" : "failed"} in ${frame.ms} ms`;
      break;
    }
    case "tool.confirm":
      line("tool", `⚙ ${frame.name}(${JSON.stringify(frame.arguments)}) waits for a yes`);
      break;
    case "audio.start":
      state.rate = frame.sample_rate;
      break;
    case "turn.done":
      state.busy = false;
      reply(frame.turn).firstChild.textContent = frame.message;
      reply(frame.turn).title = JSON.stringify(frame.timings);
      state.replies.push(frame.message);
      for (const call of frame.tool_calls) {
        const li = state.tools[call.call_id || `${frame.turn}:${call.name}`];
        const outcome = call.ok ? `→ ${JSON.stringify(call.result)}` : `✗ ${call.error}`;
        const text = `⚙ ${call.name}(${JSON.stringify(call.arguments)}) ${outcome} · ${call.ms} ms`;
        if (li) li.textContent = text;
        else line("tool", text);
      }
      break;
    case "interrupted":
      state.busy = false;
      line("note", `(the reply stopped: ${frame.reason})`);
      break;
    case "error":
      line("error", `${frame.code}${frame.stage ? " at the " + frame.stage : ""}: ${frame.message}`);
      break;
    default:
      break;
  }
}

// -- the agent's voice -------------------------------------------------------------------------

function speaker() {
  if (!state.speaker) state.speaker = new AudioContext();
  return state.speaker;
}

function onAudio(data) {
  const ctx = speaker();
  const pcm = new Int16Array(data, 0, Math.floor(data.byteLength / 2));
  if (!pcm.length) return;
  const buffer = ctx.createBuffer(1, pcm.length, state.rate);
  const samples = buffer.getChannelData(0);
  for (let i = 0; i < pcm.length; i++) samples[i] = pcm[i] / 32768;
  const source = ctx.createBufferSource();
  source.buffer = buffer;
  source.connect(ctx.destination);
  const at = Math.max(ctx.currentTime, state.playAt);
  source.start(at);
  state.playAt = at + buffer.duration;
  state.playing.add(source);
  source.onended = () => {
    state.playing.delete(source);
    state.played += buffer.duration;
  };
}

function silence() {
  for (const source of state.playing) source.stop();
  state.playing.clear();
  state.playAt = 0;
}

// Browsers start sound only after the person touched the page.
document.addEventListener("pointerdown", () => state.speaker && state.speaker.resume());
document.addEventListener("keydown", () => state.speaker && state.speaker.resume());

// -- the microphone ----------------------------------------------------------------------------

async function startMic() {
  if (state.busy) {
    send({ type: "cancel" });
    silence();
  }
  const stream = await navigator.mediaDevices.getUserMedia({
    audio: { channelCount: 1, echoCancellation: true, noiseSuppression: false, autoGainControl: false },
  });
  const ctx = new AudioContext({ sampleRate: MIC_RATE });
  const source = ctx.createMediaStreamSource(stream);
  // A ScriptProcessor keeps this one file; an AudioWorklet would need a module of its own.
  const processor = ctx.createScriptProcessor(2048, 1, 1);
  send({ type: "user_audio.start", rate: MIC_RATE });
  processor.onaudioprocess = (event) => {
    const input = event.inputBuffer.getChannelData(0);
    const pcm = new Int16Array(input.length);
    for (let i = 0; i < input.length; i++) pcm[i] = Math.max(-1, Math.min(1, input[i])) * 32767;
    if (state.ws && state.ws.readyState === WebSocket.OPEN) state.ws.send(pcm.buffer);
  };
  source.connect(processor);
  processor.connect(ctx.destination);
  state.mic = { stream, ctx, source, processor };
  $("mic").setAttribute("aria-pressed", "true");
  $("mic").textContent = "■ Done";
}

function stopMic() {
  const mic = state.mic;
  state.mic = null;
  mic.processor.onaudioprocess = null;
  mic.source.disconnect();
  mic.processor.disconnect();
  mic.stream.getTracks().forEach((track) => track.stop());
  mic.ctx.close();
  send({ type: "user_audio.end" });
  $("mic").setAttribute("aria-pressed", "false");
  $("mic").textContent = "● Talk";
}

$("mic").addEventListener("click", () => {
  if (state.mic) stopMic();
  else startMic().catch((error) => line("error", `microphone: ${error.message}`));
});

// -- typing ------------------------------------------------------------------------------------

$("say").addEventListener("submit", (event) => {
  event.preventDefault();
  const text = $("text").value.trim();
  if (!text || !state.ready) return;
  if (state.busy) {
    line("note", "(the agent is still answering: wait, or stop the reply)");
    return;
  }
  state.busy = true;
  line("user", text);
  send({ type: "user_message", text });
  $("text").value = "";
});

$("cancel").addEventListener("click", () => {
  send({ type: "cancel" });
  silence();
});

// -- the socket --------------------------------------------------------------------------------

function connect() {
  const { session_id: id, token } = state.session;
  const scheme = location.protocol === "https:" ? "wss" : "ws";
  const ws = new WebSocket(`${scheme}://${location.host}/v1/agent/stream?session_id=${encodeURIComponent(id)}`, "ino.v2");
  ws.binaryType = "arraybuffer";
  ws.onopen = () => ws.send(JSON.stringify({ type: "auth", key: token, session_id: id }));
  ws.onmessage = ({ data }) => (typeof data === "string" ? onFrame(JSON.parse(data)) : onAudio(data));
  ws.onclose = (event) => {
    state.ready = false;
    state.busy = false;
    if (state.mic) stopMic();
    setStatus("closed", `closed ${event.code}`);
    line("note", `(the socket closed: ${event.code} ${event.reason})`);
    // A reload of the agent ends its calls (4013): come back to the new code.
    if (!FINAL_CODES.has(event.code) && state.reconnects < 20) {
      state.reconnects += 1;
      setTimeout(connect, Math.min(500 * state.reconnects, 3000));
    }
  };
  state.ws = ws;
}

// -- settings ----------------------------------------------------------------------------------

function showSettings(body) {
  $("effective").textContent = JSON.stringify(body.settings, null, 1);
  const tts = body.settings.tts;
  if (tts && tts.voice != null) $("voice").placeholder = String(tts.voice);
}

async function loadSettings() {
  const answer = await fetch(`/dev/sessions/${state.session.session_id}`);
  if (answer.ok) showSettings(await answer.json());
}

$("settings").addEventListener("submit", async (event) => {
  event.preventDefault();
  const update = {};
  if ($("voice").value.trim()) update.tts = { voice: $("voice").value.trim() };
  if ($("language").value.trim()) update.stt = { language: $("language").value.trim() };
  const answer = await fetch(`/dev/sessions/${state.session.session_id}`, {
    method: "PATCH",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify(update),
  });
  const body = await answer.json();
  if (answer.ok) showSettings(body);
  else line("error", `settings refused: ${body.error}: ${body.detail || ""}`);
});

// -- the journal -------------------------------------------------------------------------------

function summary(record) {
  const body = record.body;
  if (body.type === "turn") return `${body.role}: ${body.text}`;
  if (body.type === "event") {
    const outcome = body.payload && body.payload.outcome ? ` ${body.payload.outcome}` : "";
    return `${body.name}${outcome}`;
  }
  if (body.type === "host") return `host ${body.name} ${JSON.stringify(body.payload)}`;
  return JSON.stringify(body);
}

async function followJournal() {
  const answer = await fetch("/dev/events?from=0");
  const reader = answer.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffer.indexOf("\n")) >= 0) {
      const text = buffer.slice(0, end);
      buffer = buffer.slice(end + 1);
      if (!text) continue;
      const record = JSON.parse(text);
      if (record.producer !== state.session.session_id) continue; // pings and other calls
      const li = document.createElement("li");
      li.dataset.class = record.class;
      const cls = document.createElement("span");
      cls.className = "cls";
      cls.textContent = `#${record.seq} ${record.class}`;
      li.append(cls, document.createTextNode(summary(record)));
      $("journal").append(li);
      state.records += 1;
      scrollDown($("journal").parentElement);
    }
  }
}

// -- start -------------------------------------------------------------------------------------

async function start() {
  const answer = await fetch("/dev/session", { method: "POST" });
  if (!answer.ok) {
    setStatus("closed", `no session: ${answer.status}`);
    return;
  }
  state.session = await answer.json();
  $("agent-name").textContent = state.session.agent;
  $("session").textContent = state.session.session_id;
  connect();
  followJournal().catch((error) => line("error", `journal: ${error.message}`));
}

start();
