"""How /v1/rerank puts a query and a document into one cross-encoder input, from the special-token
flags llama.cpp reads from a GGUF (the same as Hugging Face's tokenizers make of a text pair)."""

from __future__ import annotations

from types import SimpleNamespace

from appliance.api.embedding_routes import rerank_pair

Q, D = [7, 8], [9]


def vocab(**kw: object) -> SimpleNamespace:
    return SimpleNamespace(**{"bos": -1, "eos": -1, "sep": -1, "add_bos": False, "add_eos": False,
                              "add_sep": False, **kw})


def test_bert_pairs_as_cls_query_sep_document_sep():
    bert = vocab(bos=101, sep=102, add_bos=True, add_sep=True)  # WordPiece: no EOS
    assert rerank_pair(bert, Q, D) == [101, 7, 8, 102, 9, 102]


def test_xlm_roberta_closes_the_query_twice_and_the_document_once():
    xlmr = vocab(bos=0, eos=2, sep=2, add_bos=True, add_eos=True, add_sep=True)
    assert rerank_pair(xlmr, Q, D) == [0, 7, 8, 2, 2, 9, 2]


def test_flags_not_set_add_nothing():
    assert rerank_pair(vocab(bos=1, eos=2, sep=3), Q, D) == [7, 8, 9]
    assert rerank_pair(vocab(add_bos=True, add_eos=True, add_sep=True), Q, D) == [7, 8, 9]  # no such tokens
