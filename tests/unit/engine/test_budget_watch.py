"""engine/reasoning.py BudgetWatch: when a reasoning budget's close is due, fed an answer's tokens
as text one at a time (the runner's `_take`)."""

from __future__ import annotations

from appliance.engine.reasoning import BudgetWatch
from appliance.engine.sampling import ThinkBudget


def due_after(pieces: list[str], tokens: int, inside: bool) -> int | None:
    """The index of the piece after which the close is due (-1: before any), or None."""
    watch = BudgetWatch(ThinkBudget(tokens, (1, 2), inside))
    if watch.due_at_start():
        return -1
    for i, piece in enumerate(pieces):
        if watch.push(piece):
            return i
    return None


WORDS = ["One", " two", " three", " four", " five", " six"]


def test_a_block_the_prompt_opened_is_cut_after_the_budget():
    assert due_after(WORDS, 3, inside=True) == 2
    assert due_after(WORDS, 1, inside=True) == 0
    assert due_after(WORDS, 6, inside=True) == 5
    assert due_after(WORDS, 7, inside=True) is None


def test_budget_zero_closes_before_the_first_token_once():
    watch = BudgetWatch(ThinkBudget(0, (1,), True))
    assert watch.due_at_start()
    assert not any(watch.push(p) for p in ["\n", "</think>", "\n\n", "Four", " more"])


def test_a_block_the_model_opens_counts_from_after_the_tag():
    assert due_after(["<", "think", ">"] + WORDS, 2, inside=False) == 4
    assert due_after(["\n", "<think>", "\n"] + WORDS, 2, inside=False) == 3  # the newline after the tag counts
    assert due_after(["  ", "<think>"] + WORDS, 0, inside=False) == 1  # due as soon as the tag is written


def test_an_answer_that_does_not_begin_with_a_block_is_never_cut():
    assert due_after(["Four", "<think>"] + WORDS, 1, inside=False) is None
    assert due_after(["<", "th", "inking"] + WORDS, 1, inside=False) is None


def test_a_block_the_model_closes_itself_is_left_alone():
    assert due_after(["a", "</think>", "b", "c", "d"], 3, inside=True) is None
    assert due_after(["a", "</", "think", ">", "b", "c"], 3, inside=True) is None  # its tag across tokens


def test_a_close_tag_begun_at_the_budget_is_waited_for():
    # at the budget the text ends in "</": the close is due only once it is not the tag after all
    assert due_after(["a", "b", "</", "thing", "c"], 3, inside=True) == 3
    assert due_after(["a", "b", "</", "think", ">"], 3, inside=True) is None


def counted(pieces: list[str], tokens: int = -1, inside: bool = True) -> int:
    watch = BudgetWatch(ThinkBudget(tokens, (), inside))
    for piece in pieces:
        watch.push(piece)
    return watch.count


def test_the_blocks_tokens_are_counted_without_the_one_that_closes_it():
    assert counted(["a", "b", "c"]) == 3
    assert counted(["a", "b", "</think>", "answer", "more"]) == 2
    assert counted(["a", "</", "think", ">", "answer"]) == 3  # the tag's first pieces were inside
    assert counted(["<think>", "a", "b", "</think>", "c"], inside=False) == 2
    assert counted(["No", " block", " here"], inside=False) == 0


def test_without_a_bound_the_close_is_never_due():
    assert due_after(WORDS * 100, -1, inside=True) is None
    assert counted(WORDS * 100) == 600
    assert counted(WORDS, tokens=2) == 2  # counting stops at the cut: the forced close is not reasoning


def test_gemma4s_thought_channel_is_watched_by_its_own_tags():
    watch = BudgetWatch(ThinkBudget(2, (1,), False, "<|channel>thought", "<channel|>"))
    assert not watch.push("<|channel>") and not watch.push("thought") and watch.inside
    assert not watch.push("\nOne") and watch.push(" two")  # due after two tokens inside
    closed = BudgetWatch(ThinkBudget(5, (1,), False, "<|channel>thought", "<channel|>"))
    for piece in ("<|channel>", "thought", "\nOne", "<channel|>", "Four."):
        assert not closed.push(piece)
    assert not closed.inside and closed.count == 1  # the model closed it itself
