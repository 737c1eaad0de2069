// The playground's own speech detector: the level of each 20 ms frame against a noise floor
// it learns while nobody speaks. It only says when someone may be speaking; whether words came
// is the recognizer's to say (the socket's barge_in), so a cough opens a recording that is
// then discarded. No model, nothing to fetch, and tens of microseconds of work per 20 ms frame
// (bench/playground_vad.py measures it beside Silero).
// Loaded as a classic script (window.LevelDetector); the bench runs it in Node.
"use strict";

class LevelDetector {
  /**
   * @param {object} options
   * @param {number} options.rate        samples a second of what push() is given
   * @param {number} options.frameMs     the frame the level is measured on
   * @param {number} options.aboveDb     speech is this far above the noise floor ...
   * @param {number} options.minDb       ... and at least this loud (dBFS)
   * @param {number} options.startMs     loud this long in a row: speech started
   * @param {number} options.endMs       quiet this long in a row: speech ended
   * @param {number} options.prerollMs   audio kept from before the start, sent with it
   */
  constructor({ rate = 16000, frameMs = 20, aboveDb = 12, minDb = -50, startMs = 100, endMs = 700, prerollMs = 300 } = {}) {
    this.frame = Math.round((rate * frameMs) / 1000);
    this.aboveDb = aboveDb;
    this.minDb = minDb;
    this.startFrames = Math.max(1, Math.round(startMs / frameMs));
    this.endFrames = Math.max(1, Math.round(endMs / frameMs));
    this.prerollFrames = Math.max(1, Math.round(prerollMs / frameMs));
    this.floorDb = -70; // learnt: quiet rooms are near -70 dBFS, a laptop fan near -50
    this.speaking = false;
    this.loud = 0; // loud frames in a row
    this.quiet = 0; // quiet frames in a row, while speaking
    this.levelDb = -100; // the last frame's level
    this.recent = []; // the last frames, for the preroll
    this.carry = new Float32Array(0);
  }

  /** The level a frame must reach to count as speech. */
  threshold() {
    return Math.max(this.floorDb + this.aboveDb, this.minDb);
  }

  /**
   * Feed samples (-1..1). Returns what happened in them, in order: {type: "start", preroll}
   * (preroll: the frames before and of the start, to send first), {type: "audio", samples}
   * for each frame while speaking, and {type: "end"}.
   */
  push(samples) {
    const events = [];
    let data = samples;
    if (this.carry.length) {
      data = new Float32Array(this.carry.length + samples.length);
      data.set(this.carry);
      data.set(samples, this.carry.length);
    }
    let at = 0;
    for (; at + this.frame <= data.length; at += this.frame) {
      this._frame(data.subarray(at, at + this.frame), events);
    }
    this.carry = data.slice(at);
    return events;
  }

  _frame(frame, events) {
    let sum = 0;
    for (let i = 0; i < frame.length; i++) sum += frame[i] * frame[i];
    const db = Math.max(-100, 10 * Math.log10(sum / frame.length + 1e-12));
    this.levelDb = db;
    const copy = Float32Array.from(frame);
    const loud = db >= this.threshold();
    if (!this.speaking) {
      this.recent.push(copy);
      if (this.recent.length > this.prerollFrames) this.recent.shift();
      this.loud = loud ? this.loud + 1 : 0;
      if (!loud) {
        // The floor follows the room: down at once, up slowly (a voice never becomes the floor).
        this.floorDb = db < this.floorDb ? Math.max(db, -90) : this.floorDb + (db - this.floorDb) * 0.02;
      }
      if (this.loud >= this.startFrames) {
        this.speaking = true;
        this.quiet = 0;
        events.push({ type: "start", preroll: this.recent });
        this.recent = [];
      }
      return;
    }
    events.push({ type: "audio", samples: copy });
    // A little below the start's threshold still counts as speech: words fade, they do not stop.
    this.quiet = db < this.threshold() - 3 ? this.quiet + 1 : 0;
    if (this.quiet >= this.endFrames) {
      this.speaking = false;
      this.loud = 0;
      events.push({ type: "end" });
    }
  }
}

if (typeof module !== "undefined") module.exports = { LevelDetector };
else window.LevelDetector = LevelDetector;
