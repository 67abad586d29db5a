"""Turning a stream of token bytes into safe text: UTF-8 across token boundaries, stop strings."""

from __future__ import annotations

import codecs


def partial_suffix(text: str, strings: list[str]) -> int:
    """Length of the longest end of `text` that is a proper prefix of one of `strings` (text to
    hold back while it may still become one of them)."""
    for n in range(min(len(text), max((len(s) for s in strings), default=0) - 1), 0, -1):
        tail = text[-n:]
        if any(s.startswith(tail) for s in strings):
            return n
    return 0


class StopMatcher:
    """Holds back text that could be the start of a stop string; never emits a stop string.

    `feed(text)` returns (text safe to emit now, True if a stop string was found). After a
    match, everything from the stop string on is dropped.
    """

    def __init__(self, stops: list[str]):
        self.stops = [s for s in stops if s]
        self._held = ""
        self.matched: str | None = None  # the stop string found (the first one in the text)

    def feed(self, text: str) -> tuple[str, bool]:
        if not self.stops:
            return text, False
        buf = self._held + text
        first = -1
        for s in self.stops:
            i = buf.find(s)
            if i != -1 and (first == -1 or i < first):
                first, self.matched = i, s
        if first != -1:
            self._held = ""
            return buf[:first], True
        keep = partial_suffix(buf, self.stops)
        self._held = buf[len(buf) - keep :] if keep else ""
        return buf[: len(buf) - keep], False

    def flush(self) -> str:
        held, self._held = self._held, ""
        return held


class TextStream:
    """Token bytes in, emit-safe text out (multi-byte characters are never split)."""

    def __init__(self, stops: list[str]):
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._stops = StopMatcher(stops)
        self.decoded = 0  # characters the pieces so far decoded to
        self.emitted = 0  # of which given out as safe text (the rest held back, or after a stop)

    def push(self, piece: bytes, stops: bool = True) -> tuple[str, bool]:
        """Emit-safe text and whether a stop string ended it; `stops` false: text a grammar holds
        (a tool call, a structured answer), which no stop string cuts (what was held back for one
        goes out with it)."""
        text = self._utf8.decode(piece)
        self.decoded += len(text)
        out, hit = self._stops.feed(text) if stops else (self._stops.flush() + text, False)
        self.emitted += len(out)
        return out, hit

    @property
    def matched_stop(self) -> str | None:
        return self._stops.matched

    def finish(self) -> str:
        """The rest once generation ends without a stop string."""
        text, hit = self._stops.feed(self._utf8.decode(b"", final=True))
        out = text if hit else text + self._stops.flush()
        self.emitted += len(out)
        return out
