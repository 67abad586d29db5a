"""A reasoning model's thinking, given apart from its answer (`reasoning_content`, as DeepSeek's
API and llama-server give it).

Models whose chat template knows `<think>` ... `</think>` (Qwen3, DeepSeek-R1 and its distills,
QwQ, and fine-tunes of them) write their reasoning there before the answer; some templates open
the block in the generation prompt, so the answer starts inside it. Gemma 4 writes its thought
channel, `<|channel>thought` ... `<channel|>`, gpt-oss its analysis channel,
`<|channel|>analysis<|message|>` ... `<|end|>`, then its answer in the final channel (control
tokens, written out in the answer's text for this: SamplingParams.shown_tokens). With `reasoning_format`
`auto` (the default) the block becomes `reasoning_content` and the rest `content`; `none` leaves
the text as the model wrote it. An answer cut short inside the block is all reasoning.

A reasoning budget (llama-server's `--reasoning-budget`) bounds the block: once the answer has
that many tokens inside it, the runner forces the budget message and `</think>` (`BudgetWatch`),
and the model goes on with its answer. Without a bound the watch still counts the block's tokens
(`reasoning_tokens` in usage).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from .sampling import SamplingParams, ThinkBudget
from .gbnf_names import prefixed_rules
from .schema_grammar import MAX_REPEAT, never_spelling
from .text import partial_suffix

if TYPE_CHECKING:
    from ..config import ModelConfig
    from .native import Vocab
    from .runner import ModelRunner

@dataclass(frozen=True)
class Tags:
    """A think block's tags, and what a reasoning budget forces to close it."""

    open: str
    close: str
    forced_close: str
    # Control tokens that are never answer text, dropped from the content (Gemma 4 may end its
    # answer with an empty channel or a lone close; gpt-oss heads its answer with its channel),
    # the longest first.
    stray: tuple[str, ...] = ()
    shown: tuple[str, ...] = ()  # tags written out besides open and close (so that they can be dropped)

    def clean(self, content: str) -> str:
        for tag in self.stray:
            content = content.replace(tag, "")
        return content


THINK = Tags("<think>", "</think>", "\n</think>\n\n")
GEMMA4 = Tags("<|channel>thought", "<channel|>", "<channel|>", ("<|channel>thought", "<|channel>", "<channel|>"))
# gpt-oss's harmony format: the analysis channel is the reasoning, the final channel the answer.
_HARMONY_FINAL = "<|start|>assistant<|channel|>final<|message|>"
# Command R7B plans in a thinking block, and answers in a response block whose tags are not text.
COMMAND_R = Tags("<|START_THINKING|>", "<|END_THINKING|>", "<|END_THINKING|>", ("<|START_RESPONSE|>", "<|END_RESPONSE|>"),
                 ("<|START_RESPONSE|>", "<|END_RESPONSE|>"))
# Seed-OSS thinks in its own tags (a budget's reflections inside them are thought too).
SEED = Tags("<seed:think>", "</seed:think>", "</seed:think>")
# Apertus deliberates between its inner tags (its template's `enable_thinking` turns it on).
APERTUS = Tags("<|inner_prefix|>", "<|inner_suffix|>", "<|inner_suffix|>")
# Apriel 1.6 reasons after its prompt's "Here are my reasoning steps:", then answers after a
# marker (Apriel 1.5's templates ask for an end marker too).
APRIEL = Tags("Here are my reasoning steps:", "[BEGIN FINAL RESPONSE]", "\n[BEGIN FINAL RESPONSE]\n",
              ("[END FINAL RESPONSE]", "<|end|>"))
HARMONY = Tags("<|channel|>analysis<|message|>", "<|end|>", "<|end|>" + _HARMONY_FINAL,
               (_HARMONY_FINAL, "<|channel|>final<|message|>", "<|start|>assistant", "<|end|>", "<|return|>"),
               ("<|start|>", "<|return|>"))


# The prompt's last tokens that are looked at for an open tag (Apriel's is a sentence).
_TAIL_TOKENS = 16


def tags_of(template_source: str) -> Tags | None:
    """The think block's tags the chat template knows (None: it has no think block)."""
    for tags in (THINK, GEMMA4, HARMONY, COMMAND_R, APERTUS, APRIEL, SEED):
        if tags.open in template_source and tags.close in template_source:
            return tags
    return None


def has_tags(template_source: str) -> bool:
    """Whether the chat template knows think blocks."""
    return tags_of(template_source) is not None


def applies(template_source: str, reasoning_format: str | None) -> bool:
    """Whether answers are split: the template has think tags and the request did not opt out."""
    return reasoning_format != "none" and has_tags(template_source)


def opened_by_prompt(prompt_tail: str, tags: Tags = THINK) -> bool:
    """Whether the rendered prompt (its last characters) ends in an open think block."""
    return prompt_tail.rstrip().endswith(tags.open)


def for_answer(runner: ModelRunner, requested: str | None, prompt: list[int]) -> tuple[Tags | None, bool]:
    """(the tags to split the answer at, None: not split; the answer starts inside the block),
    for an answer of `runner` to `prompt`; `requested` is the request's reasoning_format (None:
    the model's configured one). A grammar (structured output, tool calls) waits until a block
    the prompt opened is closed (the runner does not ask it before), so such an answer is split
    as any other."""
    if not applies(runner.template.source, requested or runner.cfg.reasoning_format):
        return None, False
    tags = tags_of(runner.template.source)
    return tags, _starts_inside(runner, prompt, tags)


def _grammar_from_start(sampling: SamplingParams) -> bool:
    return sampling.grammar is not None and not sampling.grammar_triggers


def _starts_inside(runner: ModelRunner, prompt: list[int], tags: Tags) -> bool:
    return opened_by_prompt(runner.vocab.text(prompt[-_TAIL_TOKENS:], special=True), tags)


def effort_kwargs(effort: str | None) -> dict[str, bool | str]:
    """A reasoning effort (OpenAI's) as the template's variables: `enable_thinking` (Qwen3's),
    off for none and minimal, on for the others; `reasoning_effort` (gpt-oss's, which knows low,
    medium and high) for those three. No effort, no variable."""
    if effort is None:
        return {}
    out: dict[str, bool | str] = {"enable_thinking": effort not in ("none", "minimal")}
    if effort in ("low", "medium", "high"):
        out["reasoning_effort"] = effort
    return out


def budget_kwargs(template_source: str, budget: int) -> dict[str, int]:
    """A reasoning budget as the template's own variable, where it has one: Seed-OSS's
    `thinking_budget`, which tells the model its budget (0: answer without thinking). None (-1)
    or a template without it: nothing."""
    return {"thinking_budget": budget} if budget >= 0 and "thinking_budget" in template_source else {}


def budget_tokens(cfg: ModelConfig, requested: int | None, effort: str | None) -> int:
    """Tokens an answer's think block may take (-1: no bound): the request's, else its effort's
    entry in models[].reasoning_effort_budgets, else models[].reasoning_budget."""
    if requested is not None:
        return requested
    by_effort = cfg.reasoning_effort_budgets.get(effort) if effort else None
    return by_effort if by_effort is not None else cfg.reasoning_budget


def with_budget(runner: ModelRunner, prompt: list[int], sampling: SamplingParams, tokens: int) -> SamplingParams:
    """`sampling` with a reasoning budget of `tokens` (-1: no bound) for an answer of `runner` to
    `prompt`, where the template knows think blocks, and their tags written out in the text
    where they are control tokens. A grammar that holds the answer from its first token, where
    the prompt did not open the block, leaves a block it writes unbounded (a forced tag would
    break it); its tokens are counted all the same. `reasoning_format` does not matter: a block
    left in the content is bounded too."""
    tags = tags_of(runner.template.source)
    if tags is None:
        return sampling
    inside = _starts_inside(runner, prompt, tags)
    if _grammar_from_start(sampling) and not inside:
        tokens = -1
    vocab = runner.vocab
    close = vocab.tokenize(runner.cfg.reasoning_budget_message + tags.forced_close,
                           add_special=False, parse_special=True) if tokens >= 0 else []
    hidden = tuple(dict.fromkeys(t for tag in (tags.open, tags.close, *tags.shown)
                                 for t in vocab.tokenize(tag, add_special=False, parse_special=True)
                                 if not vocab.piece(t) and t not in sampling.shown_tokens))
    return replace(sampling, think_budget=ThinkBudget(tokens, tuple(close), inside, tags.open, tags.close),
                   shown_tokens=sampling.shown_tokens + hidden)


def think_first(runner: ModelRunner, prompt: list[int], sampling: SamplingParams, budget: int) -> SamplingParams:
    """A structured answer's grammar (response_format) with room for the think block first, where
    the model opens the block itself (Qwen3's, gpt-oss's templates) and its vocabulary has the
    closing tag as one token (a model trained to think): the block, then the answer the grammar
    holds. A block the prompt opened is waited out instead (token_pick.TokenPicker._grammar_waits); one the prompt
    closed (thinking turned off) gets none. The grammar bounds the block: `budget` tokens at most
    (up to 2000; -1: no bound)."""
    tags = tags_of(runner.template.source)
    if tags is None or sampling.grammar is None or sampling.grammar_triggers:
        return sampling
    if len(runner.vocab.tokenize(tags.close, add_special=False, parse_special=True)) != 1:
        return sampling
    tail = runner.vocab.text(prompt[-_TAIL_TOKENS:], special=True).rstrip()
    if tail.endswith(tags.open) or tail.endswith(tags.close):
        return sampling
    return replace(sampling, grammar=thinking_grammar(runner.vocab, tags, sampling.grammar, budget))


def thinking_grammar(vocab: Vocab, tags: Tags, grammar: str, budget: int = -1) -> str:
    """`grammar` after an optional think block in `tags`' form (gpt-oss: its analysis channel,
    then the final channel's header, which its answer always has)."""
    def tokens(text: str) -> tuple[str, list[int]]:
        ids = vocab.tokenize(text, add_special=False, parse_special=True)
        return " ".join(f"<[{t}]>" for t in ids), ids

    open_, _ = tokens(tags.open)
    close, close_ids = tokens(tags.close)
    if len(close_ids) == 1:
        bound = f"{{0,{budget}}}" if 0 <= budget <= MAX_REPEAT else "*"
        body = f"!{close}{bound}"
    else:  # not one token: anything that does not spell it, unbounded
        body = f"({never_spelling(tags.close)})*"
    head = ""
    if tags is HARMONY:
        block = f"{open_} {body} {close} {tokens('<|start|>')[0]} \"assistant\""
        head = tokens("<|channel|>final<|message|>")[0] + " "
    else:
        block = f'{open_} {body} {close} [ \\t\\n]{{0,8}}'
    answer = prefixed_rules(grammar, "answer-")  # the answer's rules cannot meet think-block
    return f"root ::= think-block? {head}answer-root\nthink-block ::= {block}\n{answer}"


class BudgetWatch:
    """Counts an answer's tokens inside its think block, token by token as they are generated
    (`push`), and says when the budget is spent with the block still open. A block counts only
    where `split` reads one: opened by the prompt, or the first text of the answer. `count` is
    the tokens generated inside the block, the one that ends its closing tag left out."""

    def __init__(self, budget: ThinkBudget) -> None:
        self.limit = budget.tokens
        self.open, self.close = budget.open_tag, budget.close_tag
        self.opened_by_prompt = budget.inside
        self.state = "inside" if budget.inside else "start"
        self.count = 0
        self.text = ""  # "start": the answer so far; "inside": its last characters

    @property
    def inside(self) -> bool:
        """Whether the answer is inside its think block now."""
        return self.state == "inside"

    def due_at_start(self) -> bool:
        """Whether the close is due before any token (the prompt opened the block, budget 0)."""
        return self._due(close_seen=False) if self.state == "inside" else False

    def push(self, piece: str) -> bool:
        """One generated token's text; True when the close is due now (once per answer)."""
        if self.state == "start":
            self.text += piece
            lead = self.text.lstrip()
            if not lead.startswith(self.open):
                if not self.open.startswith(lead):
                    self.state = "done"  # the answer does not begin with a block
                return False  # or blanks, or the tag so far
            self.state, self.text = "inside", lead[len(self.open):]
            return self._due(close_seen=self.close in self.text)
        if self.state != "inside":
            return False
        self.text = (self.text + piece)[-(2 * len(self.close)):]
        if self.close not in self.text:
            self.count += 1
        return self._due(close_seen=self.close in self.text)

    def _due(self, close_seen: bool) -> bool:
        if close_seen:
            self.state = "done"  # the model closed the block itself
            return False
        if self.limit < 0 or self.count < self.limit or partial_suffix(self.text, [self.close]):
            return False  # within the budget, or the model may be writing the tag itself
        self.state = "done"
        return True


def split(text: str, inside: bool, tags: Tags = THINK) -> tuple[str | None, str]:
    """(reasoning, content) of a whole answer; reasoning is None when the answer has none."""
    if not inside:
        stripped = text.lstrip()
        if not stripped.startswith(tags.open):
            return None, tags.clean(text)
        text = stripped[len(tags.open):]
    end = text.find(tags.close)
    if end < 0:
        return text.strip(), ""
    return text[:end].strip(), tags.clean(text[end + len(tags.close):].lstrip())


_AFTER_BLANKS = {"reasoning-start": "reasoning", "content-start": "after"}


class Splitter:
    """`split` as the answer streams: push pieces, get (reasoning, content) deltas whose sums are
    what `split` gives for the whole text, once `finish` has given out what was held back (blanks
    that may end the reasoning, a tail that may be the start of a tag)."""

    def __init__(self, inside: bool, tags: Tags = THINK) -> None:
        self.state = "reasoning-start" if inside else "start"
        self.held = ""
        self.tags = tags

    def push(self, piece: str) -> tuple[str, str]:
        self.held += piece
        reasoning = content = ""
        while True:
            if self.state == "start":
                lead = self.held.lstrip()
                if lead.startswith(self.tags.open):
                    self.state, self.held = "reasoning-start", lead[len(self.tags.open):]
                    continue
                if self.tags.open.startswith(lead):  # still possibly the tag (or only blanks so far)
                    return reasoning, content
                self.state = "after" if self.tags.stray else "content"
                continue
            if self.state in _AFTER_BLANKS:  # blanks that begin the reasoning or the answer are dropped
                self.held = self.held.lstrip()
                if not self.held:
                    return reasoning, content
                self.state = _AFTER_BLANKS[self.state]
                continue
            if self.state == "reasoning":
                end = self.held.find(self.tags.close)
                if end >= 0:
                    reasoning += self.held[:end].rstrip()
                    self.state, self.held = "content-start", self.held[end + len(self.tags.close):]
                    continue
                keep = _tail_to_hold(self.held, self.tags.close)
                out = self.held[:len(self.held) - keep]
                reasoning += out
                self.held = self.held[len(out):]
                return reasoning, content
            if self.state == "after":  # after the block: stray tags dropped, a tail that may be one held
                keep = partial_suffix(self.held, list(self.tags.stray)) if self.tags.stray else 0
                content += self.tags.clean(self.held[:len(self.held) - keep])
                self.held = self.held[len(self.held) - keep:]
                return reasoning, content
            content += self.held
            self.held = ""
            return reasoning, content

    def finish(self) -> tuple[str, str]:
        """What was held back: (reasoning, content)."""
        held, self.held = self.held, ""
        if self.state == "start":
            return "", self.tags.clean(held)
        if self.state in ("reasoning", "reasoning-start"):
            return held.rstrip(), ""
        if self.state == "after":
            return "", self.tags.clean(held)  # a tail that was not a stray tag after all
        return "", ""  # push gave out all but the blanks that begin the answer


def _tail_to_hold(text: str, close: str) -> int:
    """How many characters at the end of reasoning text to hold: trailing blanks (they are not
    reasoning if the closing tag follows) and what could be the start of that tag."""
    tag = partial_suffix(text, [close])
    rest = text[:len(text) - tag]
    return tag + (len(rest) - len(rest.rstrip()))
