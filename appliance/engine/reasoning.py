"""A reasoning model's thinking, given apart from its answer (`reasoning_content`, as DeepSeek's
API and llama-server give it).

Models whose chat template knows `<think>` ... `</think>` (Qwen3, DeepSeek-R1 and its distills,
QwQ, and fine-tunes of them) write their reasoning there before the answer; some templates open
the block in the generation prompt, so the answer starts inside it. With `reasoning_format`
`auto` (the default) the block becomes `reasoning_content` and the rest `content`; `none` leaves
the text as the model wrote it. An answer cut short inside the block is all reasoning.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .sampling import SamplingParams
from .text import partial_suffix

if TYPE_CHECKING:
    from .runner import ModelRunner

OPEN, CLOSE = "<think>", "</think>"


def applies(template_source: str, reasoning_format: str | None) -> bool:
    """Whether answers are split: the template has think tags and the request did not opt out."""
    return reasoning_format != "none" and OPEN in template_source and CLOSE in template_source


def opened_by_prompt(prompt_tail: str) -> bool:
    """Whether the rendered prompt (its last characters) ends in an open think block."""
    return prompt_tail.rstrip().endswith(OPEN)


def for_answer(runner: ModelRunner, requested: str | None, prompt: list[int],
               sampling: SamplingParams) -> tuple[bool, bool]:
    """(split the answer, the answer starts inside the block), for an answer of `runner` to
    `prompt`; `requested` is the request's reasoning_format (None: the model's configured one).
    A grammar from the first token (structured output, a tool format without a lazy call tag)
    leaves no room for a block the prompt opened: such an answer is read as it is."""
    think = applies(runner.template.source, requested or runner.cfg.reasoning_format)
    from_start = sampling.grammar is not None and not sampling.grammar_triggers
    return think, (think and not from_start
                   and opened_by_prompt(runner.vocab.text(prompt[-8:], special=True)))


def split(text: str, inside: bool) -> tuple[str | None, str]:
    """(reasoning, content) of a whole answer; reasoning is None when the answer has none."""
    if not inside:
        stripped = text.lstrip()
        if not stripped.startswith(OPEN):
            return None, text
        text = stripped[len(OPEN):]
    end = text.find(CLOSE)
    if end < 0:
        return text.strip(), ""
    return text[:end].strip(), text[end + len(CLOSE):].lstrip()


_AFTER_BLANKS = {"reasoning-start": "reasoning", "content-start": "content"}


class Splitter:
    """`split` as the answer streams: push pieces, get (reasoning, content) deltas whose sums are
    what `split` gives for the whole text, once `finish` has given out what was held back (blanks
    that may end the reasoning, a tail that may be the start of a tag)."""

    def __init__(self, inside: bool) -> None:
        self.state = "reasoning-start" if inside else "start"
        self.held = ""

    def push(self, piece: str) -> tuple[str, str]:
        self.held += piece
        reasoning = content = ""
        while True:
            if self.state == "start":
                lead = self.held.lstrip()
                if lead.startswith(OPEN):
                    self.state, self.held = "reasoning-start", lead[len(OPEN):]
                    continue
                if OPEN.startswith(lead):  # still possibly the tag (or only blanks so far)
                    return reasoning, content
                self.state = "content"
                continue
            if self.state in _AFTER_BLANKS:  # blanks that begin the reasoning or the answer are dropped
                self.held = self.held.lstrip()
                if not self.held:
                    return reasoning, content
                self.state = _AFTER_BLANKS[self.state]
                continue
            if self.state == "reasoning":
                end = self.held.find(CLOSE)
                if end >= 0:
                    reasoning += self.held[:end].rstrip()
                    self.state, self.held = "content-start", self.held[end + len(CLOSE):]
                    continue
                keep = _tail_to_hold(self.held)
                out = self.held[:len(self.held) - keep]
                reasoning += out
                self.held = self.held[len(out):]
                return reasoning, content
            content += self.held
            self.held = ""
            return reasoning, content

    def finish(self) -> tuple[str, str]:
        """What was held back: (reasoning, content)."""
        held, self.held = self.held, ""
        if self.state == "start":
            return "", held
        if self.state in ("reasoning", "reasoning-start"):
            return held.rstrip(), ""
        return "", ""  # after the block: push gave out all but the blanks that begin the answer


def _tail_to_hold(text: str) -> int:
    """How many characters at the end of reasoning text to hold: trailing blanks (they are not
    reasoning if `</think>` follows) and what could be the start of `</think>`."""
    tag = partial_suffix(text, [CLOSE])
    rest = text[:len(text) - tag]
    return tag + (len(rest) - len(rest.rstrip()))
