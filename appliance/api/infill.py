"""Fill-in-the-middle prompts: the text before a gap and after it, and the model writes the gap
(OpenAI completions' `suffix`, llama-server's /infill), for models whose vocabulary has the FIM
tokens llama.cpp finds (Qwen2.5-Coder's `<|fim_prefix|>`, CodeLlama's `<PRE>`, Granite's, ...).

The prompt is llama-server's repository-level layout: `[FIM_REP]myproject\\n`, each extra file as
`[FIM_SEP]filename\\n` and its text (where the vocabulary has no file separator, a snippet
marker), `[FIM_SEP]filename\\n`, then `[FIM_PRE]prefix text[FIM_SUF]suffix[FIM_MID]` (the
text already typed in the gap goes after the prefix, as llama-server puts it). Where it is too
long for the context, llama-server's 3:1 split applies to what the context leaves after the
answer (not to one batch, as llama-server does: the server prefills in chunks): the prefix keeps
its end, the suffix its beginning, and the extra files what is left, from their end. BOS (where
the tokenizer adds one) comes first.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from ..engine.native import Vocab
from .errors import bad_request

REPOSITORY = "myproject\n"  # llama-server's project name
CURRENT_FILE = "filename\n"  # and the name of the file with the gap
SNIPPET = "\n\n--- snippet ---\n\n"  # between extra chunks where there is no file separator


class InfillPrompt(NamedTuple):
    tokens: list[int]
    truncated: bool  # some of the prefix, the suffix or the extra files did not fit


def infill_prompt(vocab: Vocab, prefix: str, suffix: str, *, extra: Sequence[tuple[str, str]] = (), typed: str = "",
                  n_ctx: int, max_tokens: int, param: str) -> InfillPrompt:
    """The prompt; `extra` are (filename, text) of other files, `typed` the text already in the
    gap. A model without the FIM tokens is a 400 on `param`."""
    fim = vocab.fim
    if not fim.usable:
        raise bad_request("this model has no fill-in-the-middle tokens (its vocabulary has no prefix, suffix and "
                          "middle tokens llama.cpp knows)", param=param)

    def tokens(text: str) -> list[int]:
        return vocab.tokenize(text, add_special=False, parse_special=False) if text else []

    before, after, middle = tokens(prefix), tokens(suffix), tokens(typed)
    files: list[int] = [fim.rep, *tokens(REPOSITORY)] if fim.rep >= 0 else []
    for filename, text in extra:
        files += [fim.sep, *tokens(filename + "\n")] if fim.sep >= 0 else tokens(SNIPPET)
        files += tokens(text)
    if fim.sep >= 0:
        files += [fim.sep, *tokens(CURRENT_FILE)]
    bos = [vocab.bos] if vocab.add_bos and vocab.bos >= 0 else []
    room = max(0, n_ctx - max_tokens - len(bos) - 3 - len(middle))
    n_after = min(len(after), max(room // 4, room - len(before)))
    n_before = min(len(before), room - n_after)
    n_files = min(len(files), room - n_after - n_before)
    tokens = (bos + files[len(files) - n_files:] + [fim.pre] + before[len(before) - n_before:] + middle
              + [fim.suf] + after[:n_after] + [fim.mid])
    return InfillPrompt(tokens, (n_before, n_after, n_files) != (len(before), len(after), len(files)))
