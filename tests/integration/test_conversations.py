"""The Conversations API through the real server and the OpenAI SDK: a conversation's items are
the prompt's earlier turns (the answer is the one the same items given as input get), a
response's input and output join it when it ends, items are listed, added, read and deleted,
bad requests name their field, and conversations outlive a restart."""

from __future__ import annotations

import httpx
import openai
import pytest

from conftest import SMOLLM2, model_entry

NAME = [{"type": "message", "role": "user", "content": "My name is Ada and I like green."},
        {"type": "message", "role": "assistant", "content": "Nice to meet you, Ada."}]


@pytest.fixture(scope="module")
def server(server_factory, tmp_path_factory):
    config = {"server": {"state_dir": str(tmp_path_factory.mktemp("conversations"))},
              "models": [model_entry("smol", SMOLLM2, n_ctx=2048, n_parallel=2)]}
    return server_factory(config, "conversations"), config


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server[0].base + "/v1", api_key="none", max_retries=0, timeout=120)


def test_a_conversation_is_the_prompt_before_the_input_and_grows_with_each_response(client):
    conversation = client.conversations.create(items=NAME, metadata={"topic": "names"})
    assert conversation.object == "conversation" and conversation.metadata == {"topic": "names"}
    ask = {"model": "smol", "temperature": 0, "max_output_tokens": 16}
    made = client.responses.create(input="What is my name?", conversation=conversation.id, **ask)
    alone = client.responses.create(input=NAME + [{"role": "user", "content": "What is my name?"}], **ask)
    assert made.conversation.id == conversation.id
    assert made.output_text == alone.output_text != "" and made.usage.input_tokens == alone.usage.input_tokens
    items = client.conversations.items.list(conversation.id, order="asc").data
    assert [i.type for i in items] == ["message"] * 4 and items[3].role == "assistant"
    assert items[2].content[0].text == "What is my name?" and items[3].content[0].text == made.output_text
    # the next turn reads the first one's answer too
    second = client.responses.create(input="And my colour?", conversation={"id": conversation.id}, **ask)
    again = client.responses.create(input=NAME + [{"role": "user", "content": "What is my name?"},
                                                  {"role": "assistant", "content": made.output_text},
                                                  {"role": "user", "content": "And my colour?"}], **ask)
    assert second.output_text == again.output_text and second.usage.input_tokens == again.usage.input_tokens
    assert len(client.conversations.items.list(conversation.id).data) == 6


def test_items_are_added_read_listed_and_deleted(client):
    conversation = client.conversations.create()
    added = client.conversations.items.create(conversation.id, items=NAME)
    assert [i.role for i in added.data] == ["user", "assistant"] and not added.has_more
    first = added.data[0].id
    assert client.conversations.items.retrieve(first, conversation_id=conversation.id).content[0].text == NAME[0]["content"]
    page = client.conversations.items.list(conversation.id, limit=1)  # newest first
    assert page.data[0].role == "assistant" and page.has_more
    assert client.conversations.items.delete(first, conversation_id=conversation.id).id == conversation.id
    assert [i.role for i in client.conversations.items.list(conversation.id).data] == ["assistant"]
    updated = client.conversations.update(conversation.id, metadata={"k": "v"})
    assert updated.metadata == {"k": "v"} and client.conversations.retrieve(conversation.id).metadata == {"k": "v"}
    assert client.conversations.delete(conversation.id).deleted
    with pytest.raises(openai.NotFoundError):
        client.conversations.retrieve(conversation.id)


def test_input_tokens_counts_a_conversations_items(client):
    conversation = client.conversations.create(items=NAME)
    counted = client.responses.input_tokens.count(model="smol", conversation=conversation.id)
    with_input = client.responses.input_tokens.count(model="smol", conversation=conversation.id,
                                                     input="What is my name?")
    made = client.responses.create(model="smol", conversation=conversation.id, input="What is my name?",
                                   max_output_tokens=4, temperature=0)
    assert counted.input_tokens < with_input.input_tokens == made.usage.input_tokens


@pytest.mark.parametrize("method,path,body,status,param", [
    ("POST", "/v1/responses", {"model": "smol", "input": "Hi", "conversation": "conv_nothing"}, 404, "conversation"),
    ("POST", "/v1/responses", {"model": "smol", "input": "Hi", "conversation": {"id": 3}}, 400, "conversation"),
    ("POST", "/v1/responses", {"model": "smol", "input": "Hi", "conversation": "{conv}",
                               "previous_response_id": "resp_x"}, 400, "conversation"),
    ("POST", "/v1/conversations", {"items": [{"type": "web_search_call"}]}, 400, "items[0].type"),
    ("POST", "/v1/conversations", {"items": [{"role": "user", "content": "x"}] * 21}, 400, "items"),
    ("POST", "/v1/conversations/{conv}/items", {"items": []}, 400, "items"),
    ("POST", "/v1/conversations/{conv}/items", {"items": [{"id": "{item}", "role": "user", "content": "x"}]}, 400,
     "items[0].id"),
    # a response's input joins the conversation: its ids are held to the same rule
    ("POST", "/v1/responses", {"model": "smol", "conversation": "{conv}", "max_output_tokens": 4,
                               "input": [{"id": "{item}", "role": "user", "content": "x"}]}, 400, "input[0].id"),
    ("POST", "/v1/responses", {"model": "smol", "conversation": "{conv}", "max_output_tokens": 4,
                               "input": [{"id": "msg_a", "role": "user", "content": "x"},
                                         {"id": "msg_a", "role": "user", "content": "y"}]}, 400, "input[1].id"),
    ("POST", "/v1/conversations/{conv}", {"metadata": {"k" * 65: "v"}}, 400, "metadata"),
    ("GET", "/v1/conversations/{conv}/items?limit=0", None, 400, "limit"),
    ("GET", "/v1/conversations/{conv}/items/msg_nothing", None, 404, None),
])
def test_bad_requests_name_the_field(server, client, method, path, body, status, param):
    conversation = client.conversations.create(items=NAME[:1])
    item = client.conversations.items.list(conversation.id).data[0].id
    fill = lambda s: s.replace("{conv}", conversation.id).replace("{item}", item)  # noqa: E731
    if body is not None:
        body = eval(fill(repr(body)))  # the ids in the body too
    r = httpx.request(method, server[0].base + fill(path), json=body, timeout=60)
    assert r.status_code == status, r.text
    assert r.json()["error"].get("param") == param or param is None, r.text


def test_conversations_outlive_a_restart(server_factory, server, client):
    srv, config = server
    conversation = client.conversations.create(items=NAME, metadata={"kept": "yes"})
    srv.stop()
    after = server_factory(config, "conversations-after")
    reopened = openai.OpenAI(base_url=after.base + "/v1", api_key="none", max_retries=0, timeout=120)
    assert reopened.conversations.retrieve(conversation.id).metadata == {"kept": "yes"}
    items = reopened.conversations.items.list(conversation.id, order="asc").data
    assert [i.content[0].text for i in items] == [m["content"] for m in NAME]
