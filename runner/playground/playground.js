// The playground of `runner dev`: the agent over the ino.v2 socket, and its call's journal.
// Plain JavaScript, no build step. `window.playground` is its state, read by the browser tests.
"use strict";

const $ = (id) => document.getElementById(id);
// Codes after which reconnecting cannot help (the page of the protocol says which).
const FINAL_CODES = new Set([4002, 4004, 4008, 4010]);
const MIC_RATE = 16000;
// The close reason of a call that ended under the socket (on a reload of the agent).
const CALL_ENDED = "the call ended";

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
  answered: [], // the turn of each
  spokenTurns: [], // the turn of each spoken turn (heard)
  mic: null, // the open microphone: {stream, ctx, source, processor, mode: "push" | "hands-free"}
  detector: null, // hands-free: the speech detector (vad.js)
  recording: null, // hands-free: the open recording {id, words, ending, timer}
  recordings: [], // hands-free: every recording's id and how it ended ("turn" or "discarded")
  bargeIns: [], // every barge_in frame, and how much was playing when it came
  partials: [], // every heard.partial text shown
  peakDb: -100, // the loudest microphone level the meter showed
  dropTurn: null, // a turn whose audio is no longer played (stopped by a barge-in)
  dropping: false,
  waitingEnd: null, // the recording whose end was sent, until its turn is heard
  pendingEnd: false, // that end was refused (a turn still ran): sent again when it ends
  reconnects: 0,
  records: 0,
  conversations: 0, // how many the page opened: a reload of the agent opens the next
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
    case "heard.partial":
      showPartial(frame.text);
      break;
    case "barge_in":
      onBargeIn(frame);
      break;
    case "heard":
      state.heard.push(frame.text);
      state.spokenTurns.push(frame.turn);
      state.waitingEnd = null;
      clearPartial();
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
      state.dropping = frame.turn != null && frame.turn === state.dropTurn;
      break;
    case "turn.done":
      state.busy = false;
      endPending();
      reply(frame.turn).firstChild.textContent = frame.message;
      reply(frame.turn).title = JSON.stringify(frame.timings);
      state.replies.push(frame.message);
      state.answered.push(frame.turn);
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
      endPending();
      break;
    case "error":
      if (frame.code === "conflict" && frame.recording_id != null && frame.recording_id === state.waitingEnd) {
        // The recording's end came while a turn still ran: it stays open; end it once that turn ends.
        state.pendingEnd = true;
        break;
      }
      line("error", `${frame.code}${frame.stage ? " at the " + frame.stage : ""}: ${frame.message}`);
      break;
    default:
      break;
  }
}

// -- the agent's voice -------------------------------------------------------------------------

function speaker() {
  if (!state.speaker) {
    state.speaker = new AudioContext();
    state.volume = state.speaker.createGain();
    state.volume.connect(state.speaker.destination);
  }
  return state.speaker;
}

// While a hands-free recording waits to know whether the person spoke, the agent speaks lower.
function duck(low) {
  speaker();
  state.volume.gain.value = low ? 0.3 : 1;
}

function onAudio(data) {
  if (state.dropping) return; // the rest of a reply the person talked over
  const ctx = speaker();
  const pcm = new Int16Array(data, 0, Math.floor(data.byteLength / 2));
  if (!pcm.length) return;
  const buffer = ctx.createBuffer(1, pcm.length, state.rate);
  const samples = buffer.getChannelData(0);
  for (let i = 0; i < pcm.length; i++) samples[i] = pcm[i] / 32768;
  const source = ctx.createBufferSource();
  source.buffer = buffer;
  source.connect(state.volume);
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
  for (const source of state.playing) {
    source.onended = null; // stopped, not played
    source.stop();
  }
  state.playing.clear();
  state.playAt = 0;
}

// Browsers start sound only after the person touched the page.
document.addEventListener("pointerdown", () => state.speaker && state.speaker.resume());
document.addEventListener("keydown", () => state.speaker && state.speaker.resume());

// -- the microphone ----------------------------------------------------------------------------

// The microphone at 16 kHz; each 32 ms of it goes to `onSamples` (-1..1).
async function openMic(mode, onSamples) {
  const stream = await navigator.mediaDevices.getUserMedia({
    audio: { channelCount: 1, echoCancellation: true, noiseSuppression: false, autoGainControl: false },
  });
  const ctx = new AudioContext({ sampleRate: MIC_RATE });
  const source = ctx.createMediaStreamSource(stream);
  // A ScriptProcessor keeps this one file; an AudioWorklet would need a module of its own.
  const processor = ctx.createScriptProcessor(512, 1, 1);
  processor.onaudioprocess = (event) => onSamples(event.inputBuffer.getChannelData(0));
  source.connect(processor);
  processor.connect(ctx.destination);
  state.mic = { stream, ctx, source, processor, mode };
}

function closeMic() {
  const mic = state.mic;
  state.mic = null;
  mic.processor.onaudioprocess = null;
  mic.source.disconnect();
  mic.processor.disconnect();
  mic.stream.getTracks().forEach((track) => track.stop());
  mic.ctx.close();
  showLevel(-100);
}

function sendPcm(samples) {
  const pcm = new Int16Array(samples.length);
  for (let i = 0; i < samples.length; i++) pcm[i] = Math.max(-1, Math.min(1, samples[i])) * 32767;
  if (state.ws && state.ws.readyState === WebSocket.OPEN) state.ws.send(pcm.buffer);
}

function level(samples) {
  let sum = 0;
  for (let i = 0; i < samples.length; i++) sum += samples[i] * samples[i];
  return Math.max(-100, 10 * Math.log10(sum / samples.length + 1e-12));
}

// The meter: -70 dBFS (nothing) to 0 (full scale).
function showLevel(db) {
  state.peakDb = Math.max(state.peakDb, db);
  const fill = Math.max(0, Math.min(1, (db + 70) / 70));
  $("level").style.width = `${Math.round(fill * 100)}%`;
  $("meter").dataset.speaking = state.recording ? "yes" : "no";
}

function showPartial(text) {
  if (!text) return;
  state.partials.push(text);
  let li = document.querySelector("#transcript li.partial");
  if (!li) li = line("user partial", "");
  li.textContent = text;
  scrollDown($("transcript"));
}

function clearPartial() {
  const li = document.querySelector("#transcript li.partial");
  if (li) li.remove();
}

// Push to talk: everything between the two clicks is the turn.

async function startTalk() {
  if (state.mic) stopMic();
  if (state.busy) {
    send({ type: "cancel" });
    silence();
  }
  await openMic("push", (samples) => {
    showLevel(level(samples));
    sendPcm(samples);
  });
  send({ type: "user_audio.start", rate: MIC_RATE });
  $("mic").setAttribute("aria-pressed", "true");
  $("mic").textContent = "■ Done";
}

function stopTalk() {
  closeMic();
  send({ type: "user_audio.end" });
  $("mic").setAttribute("aria-pressed", "false");
  $("mic").textContent = "● Talk";
}

// Hands-free: the detector opens a barge_in recording when the person may be speaking, and
// closes it when they stop: as the turn if the recognizer heard words (its barge_in came),
// else discarded (a cough, a door, the agent's own voice).

// After the detector's end, how long the recognizer may take to say whether it heard words.
// It answers within a second on an idle machine, and took up to 4 s on a loaded one (load
// average 20 on 2 cores, the agent speaking meanwhile). Only a wordless sound waits this
// long (the recording stays open, and speech in that time joins it); words end it at once.
const WORDS_GRACE_MS = 8000;

async function startHandsFree() {
  if (state.mic) stopMic();
  state.detector = new LevelDetector({ rate: MIC_RATE });
  await openMic("hands-free", (samples) => {
    const events = state.detector.push(samples);
    for (const event of events) onDetected(event);
    // Between the detector's end and the recognizer's answer the room's sound still goes, so
    // the recognizer hears the recording out.
    if (state.recording && state.recording.ending && !events.length) sendPcm(samples);
    showLevel(state.detector.levelDb);
  });
  $("hands-free").setAttribute("aria-pressed", "true");
  $("hands-free").textContent = "■ Stop listening";
}

function stopHandsFree() {
  closeMic();
  if (state.recording) finishRecording(false);
  state.detector = null;
  $("hands-free").setAttribute("aria-pressed", "false");
  $("hands-free").textContent = "◉ Hands-free";
}

function onDetected(event) {
  const recording = state.recording;
  if (event.type === "start") {
    if (recording) {
      // Speaking again before the recognizer answered: the same recording goes on (the room's
      // sound since the end was sent as it came, so the preroll is not sent again).
      clearTimeout(recording.timer);
      recording.ending = false;
      return;
    }
    {
      if (!state.ready) return;
      const id = `hands-free-${state.recordings.length + 1}`;
      state.recording = { id, words: false, ending: false, timer: null };
      state.recordings.push({ id, outcome: null });
      send({ type: "user_audio.start", rate: MIC_RATE, barge_in: true, recording_id: id });
      duck(true);
    }
    for (const frame of event.preroll) sendPcm(frame);
  } else if (event.type === "audio") {
    if (recording) sendPcm(event.samples);
  } else if (event.type === "end" && recording) {
    if (recording.words) finishRecording(true);
    else {
      recording.ending = true;
      recording.timer = setTimeout(() => finishRecording(false), WORDS_GRACE_MS);
    }
  }
}

// The recording's end: the turn (words came), or thrown away.
function finishRecording(turn) {
  const recording = state.recording;
  clearTimeout(recording.timer);
  state.recording = null;
  duck(false);
  const entry = state.recordings.find((r) => r.id === recording.id);
  entry.outcome = turn ? "turn" : "discarded";
  if (turn) {
    state.waitingEnd = recording.id;
    send({ type: "user_audio.end" });
  } else {
    send({ type: "user_audio.end", discard: true });
    clearPartial();
  }
}

// The socket closed under an open recording: it went with it.
function dropRecording() {
  clearTimeout(state.recording.timer);
  state.recordings.find((r) => r.id === state.recording.id).outcome = "lost";
  state.recording = null;
  duck(false);
  clearPartial();
}

function onBargeIn(frame) {
  const unplayed = state.speaker ? Math.max(0, state.playAt - state.speaker.currentTime) : 0;
  state.bargeIns.push({ text: frame.text, turn: frame.turn, playing: state.playing.size, unplayed });
  // The person talked over the agent: its voice stops now, and what else comes of that reply is not played.
  silence();
  state.dropTurn = frame.turn;
  state.dropping = frame.turn != null;
  const recording = state.recording;
  if (recording && frame.recording_id === recording.id) {
    recording.words = true;
    if (recording.ending) finishRecording(true);
  }
}

// A recording's end refused while the interrupted turn unwound: send it again now.
function endPending() {
  state.dropping = false;
  if (state.pendingEnd) {
    state.pendingEnd = false;
    send({ type: "user_audio.end" });
  }
}

function stopMic() {
  if (!state.mic) return;
  if (state.mic.mode === "push") stopTalk();
  else stopHandsFree();
}

$("mic").addEventListener("click", () => {
  if (state.mic && state.mic.mode === "push") stopTalk();
  else startTalk().catch((error) => line("error", `microphone: ${error.message}`));
});

$("hands-free").addEventListener("click", () => {
  if (state.mic && state.mic.mode === "hands-free") stopHandsFree();
  else startHandsFree().catch((error) => line("error", `microphone: ${error.message}`));
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
    // Push to talk ends with its socket; hands-free keeps listening, for the next socket.
    if (state.mic && state.mic.mode === "push") stopTalk();
    if (state.recording) dropRecording();
    setStatus("closed", `closed ${event.code}`);
    line("note", `(the socket closed: ${event.code} ${event.reason})`);
    if (FINAL_CODES.has(event.code) || state.reconnects >= 20) return;
    state.reconnects += 1;
    const again = Math.min(500 * state.reconnects, 3000);
    // Saving the agent's file ends its calls (4013, the call ended): the page starts a new
    // conversation with the new code, which greets again. Any other close keeps this one.
    if (event.code === 4013 && event.reason.startsWith(CALL_ENDED)) setTimeout(restart, again);
    else setTimeout(connect, again);
  };
  state.ws = ws;
}

// -- settings ----------------------------------------------------------------------------------

// The form offers only what the host's PATCH may change; with nothing adjustable, no form.
function showSettings(body) {
  const settings = body.settings;
  $("effective").textContent = JSON.stringify(settings, null, 1);
  if (body.adjustable) {
    const adjustable = new Set(body.adjustable);
    for (const label of document.querySelectorAll("#settings [data-path]")) {
      label.hidden = !adjustable.has(label.dataset.path);
    }
    $("settings").hidden = adjustable.size === 0;
    $("fixed").hidden = adjustable.size !== 0;
  }
  const current = {
    voice: settings.tts && settings.tts.voice,
    "tts-model": settings.tts && settings.tts.model,
    language: settings.stt && settings.stt.language,
    "llm-provider": settings.llm && settings.llm.provider,
    "llm-model": settings.llm && settings.llm.model,
  };
  for (const [id, value] of Object.entries(current)) $(id).placeholder = value == null ? "" : String(value);
}

async function loadSettings() {
  const answer = await fetch(`/dev/sessions/${state.session.session_id}`);
  if (answer.ok) showSettings(await answer.json());
}

// A field's value, if it is shown and filled.
function field(id) {
  const input = $(id);
  return input.closest("label").hidden ? "" : input.value.trim();
}

$("settings").addEventListener("submit", async (event) => {
  event.preventDefault();
  const update = {};
  const tts = {};
  if (field("voice")) tts.voice = field("voice");
  if (field("tts-model")) tts.model = field("tts-model");
  if (Object.keys(tts).length) update.tts = tts;
  if (field("language")) update.stt = { language: field("language") };
  if (field("llm-provider") || field("llm-model")) {
    update.llm = {
      provider: field("llm-provider") || $("llm-provider").placeholder,
      model: field("llm-model") || $("llm-model").placeholder,
    };
  }
  if (!Object.keys(update).length) return;
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

// A new conversation (a key and a session id, as an app's server would make them).
async function openConversation() {
  const answer = await fetch("/dev/session", { method: "POST" });
  if (!answer.ok) {
    setStatus("closed", `no session: ${answer.status}`);
    return false;
  }
  state.session = await answer.json();
  state.conversations += 1;
  $("agent-name").textContent = state.session.agent;
  $("session").textContent = state.session.session_id;
  return true;
}

async function restart() {
  if (!(await openConversation())) return;
  line("note", `(the agent was reloaded: a new conversation, ${state.session.session_id})`);
  connect();
}

async function start() {
  if (!(await openConversation())) return;
  connect();
  followJournal().catch((error) => line("error", `journal: ${error.message}`));
}

start();
