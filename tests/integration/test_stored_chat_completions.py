"""OpenAI's stored chat completions through the real server and the OpenAI SDK: an answer made
with `store: true` (whole or streamed, from a model or a group) is read back as it was answered,
with its metadata and messages; stored ones are listed (model and metadata filters, order,
pages), their metadata changed, deleted; another key sees none of them; they outlive a restart;
an answer made without `store` is not kept."""

from __future__ import annotations

import httpx
import openai
import pytest

from conftest import SMOLLM2, model_entry

KEY, OTHER = "stored-chat-key-one", "stored-chat-key-two"
ASK = {"model": "smol", "temperature": 0, "max_tokens": 8}


def config(state_dir) -> dict:
    return {"server": {"api_keys": [KEY, OTHER], "state_dir": str(state_dir)},
            "models": [model_entry("smol", SMOLLM2, n_ctx=1024, n_parallel=2)],
            "groups": [{"name": "duo", "models": ["smol"]}]}


@pytest.fixture(scope="module")
def state_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("stored-chat")


@pytest.fixture(scope="module")
def server(server_factory, state_dir):
    return server_factory(config(state_dir), "stored-chat")


def sdk(server, key: str = KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base + "/v1", api_key=key, max_retries=0, timeout=120)


def ask(client: openai.OpenAI, content: str, **extra):
    return client.chat.completions.create(messages=[{"role": "user", "content": content}], **(ASK | extra))


def test_a_stored_answer_is_read_back_with_its_metadata_and_messages(server):
    client = sdk(server)
    made = client.chat.completions.create(
        messages=[{"role": "system", "content": "Be brief."},
                  {"role": "user", "content": [{"type": "text", "text": "Name a "}, {"type": "text", "text": "colour."}]}],
        store=True, metadata={"run": "one"}, seed=5, **ASK)
    got = client.chat.completions.retrieve(made.id)
    assert got.id == made.id and got.created == made.created and got.model == "smol"
    assert got.choices[0].message.content == made.choices[0].message.content != ""
    assert got.choices[0].finish_reason == made.choices[0].finish_reason
    assert got.usage.model_dump() == made.usage.model_dump()
    extra = got.model_extra
    assert got.metadata == {"run": "one"} and extra["seed"] == 5 and extra["temperature"] == 0
    assert extra["request_id"]
    messages = client.chat.completions.messages.list(made.id)
    assert [m.role for m in messages.data] == ["system", "user"] and not messages.has_more
    assert messages.data[0].content == "Be brief." and messages.data[0].content_parts is None
    assert messages.data[1].content == "Name a colour."
    assert [p.text for p in messages.data[1].content_parts] == ["Name a ", "colour."]
    assert messages.data[0].id != messages.data[1].id
    page = client.chat.completions.messages.list(made.id, limit=1, order="desc")
    assert [m.role for m in page.data] == ["user"] and page.has_more


def test_a_streamed_answer_is_stored_whole(server):
    client = sdk(server)
    chunks = list(client.chat.completions.create(messages=[{"role": "user", "content": "Name a fruit."}],
                                                 stream=True, store=True, stream_options={"include_usage": True},
                                                 **ASK))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    got = client.chat.completions.retrieve(chunks[0].id)  # stored before [DONE]
    assert got.choices[0].message.content == text != ""
    assert got.usage.completion_tokens == chunks[-1].usage.completion_tokens
    assert got.choices[0].finish_reason == next(c.choices[0].finish_reason for c in chunks
                                                if c.choices and c.choices[0].finish_reason)


def test_an_answer_without_store_is_not_kept(server):
    client = sdk(server)
    made = ask(client, "Name a city.")
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.retrieve(made.id)
    assert e.value.body["code"] == "chat_completion_not_found"


def test_stored_answers_are_listed_updated_and_deleted(server):
    client = sdk(server)
    made = [ask(client, f"Count to {i}.", store=True, metadata={"batch": "list", "i": str(i)}) for i in range(3)]
    listed = client.chat.completions.list(metadata={"batch": "list"})
    assert [c.id for c in listed.data] == [m.id for m in made]  # oldest first
    assert [c.id for c in client.chat.completions.list(metadata={"batch": "list", "i": "1"}).data] == [made[1].id]
    newest = client.chat.completions.list(metadata={"batch": "list"}, order="desc", limit=2)
    assert [c.id for c in newest.data] == [made[2].id, made[1].id] and newest.has_more
    rest = client.chat.completions.list(metadata={"batch": "list"}, order="desc", after=made[1].id)
    assert [c.id for c in rest.data] == [made[0].id]
    assert client.chat.completions.list(model="nope").data == []
    assert made[0].id in [c.id for c in client.chat.completions.list(model="smol", limit=100).data]

    updated = client.chat.completions.update(made[0].id, metadata={"batch": "moved"})
    assert updated.metadata == {"batch": "moved"}
    assert client.chat.completions.retrieve(made[0].id).metadata == {"batch": "moved"}
    assert [c.id for c in client.chat.completions.list(metadata={"batch": "list"}).data] == [m.id for m in made[1:]]

    deleted = client.chat.completions.delete(made[1].id)
    assert deleted.id == made[1].id and deleted.deleted and deleted.object == "chat.completion.deleted"
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.retrieve(made[1].id)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.delete(made[1].id)


def test_another_key_sees_none_of_them(server):
    made = ask(sdk(server), "Name a bird.", store=True)
    other = sdk(server, OTHER)
    with pytest.raises(openai.NotFoundError):
        other.chat.completions.retrieve(made.id)
    with pytest.raises(openai.NotFoundError):
        other.chat.completions.messages.list(made.id)
    assert made.id not in [c.id for c in other.chat.completions.list(limit=100).data]


def test_bad_requests_name_their_field(server):
    headers = {"Authorization": f"Bearer {KEY}"}
    made = ask(sdk(server), "Name a tree.", store=True)
    for body, param in (({}, "metadata"), ({"metadata": {"k" * 65: "v"}}, "metadata")):
        r = httpx.post(f"{server.base}/v1/chat/completions/{made.id}", json=body, headers=headers)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    r = httpx.get(server.base + "/v1/chat/completions", params={"order": "up"}, headers=headers)
    assert r.status_code == 400 and r.json()["error"]["param"] == "order"
    r = httpx.get(server.base + "/v1/chat/completions", params={"after": "chatcmpl-none"}, headers=headers)
    assert r.status_code == 400 and r.json()["error"]["param"] == "after"
    r = httpx.post(server.base + "/v1/chat/completions", headers=headers,
                   json={**ASK, "messages": [{"role": "user", "content": "Hi"}], "metadata": {"a": 1}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "metadata[...]"


def test_a_group_answer_is_stored_whole_or_streamed(server):
    client = sdk(server)
    made = client.chat.completions.create(model="duo", messages=[{"role": "user", "content": "Name a sea."}],
                                          max_tokens=8, temperature=0, store=True)
    assert client.chat.completions.retrieve(made.id).choices[0].message.content == made.choices[0].message.content
    chunks = list(client.chat.completions.create(model="duo", messages=[{"role": "user", "content": "Name a sea."}],
                                                 max_tokens=8, temperature=0, store=True, stream=True,
                                                 stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    got = client.chat.completions.retrieve(chunks[0].id)  # stored before [DONE]
    assert got.model == "duo" and got.choices[0].message.content == text == made.choices[0].message.content
    assert got.usage.completion_tokens == chunks[-1].usage.completion_tokens


def test_stored_answers_outlive_a_restart(server, server_factory, state_dir):
    made = ask(sdk(server), "Name a river.", store=True, metadata={"kept": "yes"})
    server.stop()
    again = server_factory(config(state_dir), "stored-chat-again")
    client = sdk(again)
    got = client.chat.completions.retrieve(made.id)
    assert got.choices[0].message.content == made.choices[0].message.content
    assert [c.id for c in client.chat.completions.list(metadata={"kept": "yes"}).data] == [made.id]
    assert client.chat.completions.messages.list(made.id).data[0].content == "Name a river."
