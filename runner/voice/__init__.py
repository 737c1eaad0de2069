"""The voice of a call: the turn engine, the sentence chunker, voice activity, audio helpers."""
