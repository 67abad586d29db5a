"""Background responses (the Responses API's background: true) through the real server: queued at
once, then the same answer as a foreground request; cancelled while queued or while running,
without disturbing another request; bad requests refused before they start; the drain waiting
for one within its grace and ending the rest as failed, and one a killed process never finished
reading as failed after the restart."""

from __future__ import annotations

import concurrent.futures
import json
import time

import httpx
import openai
import pytest

from conftest import SMOLLM2, model_entry
from opshelp import wait_for

GPL = open("/usr/share/common-licenses/GPL-3").read()
# a JSON answer whose string must run long: the grammar keeps the model writing
LONG = {"format": {"type": "json_schema", "name": "long", "schema": {
    "type": "object", "properties": {"story": {"type": "string", "minLength": 2000}}, "required": ["story"]}}}


@pytest.fixture(scope="module")
def srv(server_factory):
    return server_factory({"models": [model_entry("smol", SMOLLM2, n_ctx=1024, n_parallel=1)],
                           "groups": [{"name": "chain", "type": "sequential", "models": ["smol", "smol"]}]},
                          "responses-background")


def post(srv, **body) -> httpx.Response:
    return httpx.post(srv.base + "/v1/responses", timeout=120, json={"model": "smol", "temperature": 0, **body})


def get(srv, response_id: str) -> dict:
    r = httpx.get(f"{srv.base}/v1/responses/{response_id}")
    assert r.status_code == 200, r.text
    return r.json()


def finished(srv, response_id: str, timeout: float = 90) -> dict:
    return wait_for(lambda: (r := get(srv, response_id))["status"] not in ("queued", "in_progress") and r,
                    timeout=timeout)


def sched(srv) -> dict:
    return httpx.get(srv.base + "/v1/admin/scheduling/status").json()["models"]["smol"]


def text(response: dict) -> str:
    return "".join(part["text"] for item in response["output"] if item["type"] == "message"
                   for part in item["content"])


def test_a_background_response_is_queued_at_once_and_answers_as_a_foreground_one(srv):
    body = {"input": "Name three colors.", "max_output_tokens": 24}
    foreground = post(srv, **body).json()
    t0 = time.monotonic()
    queued = post(srv, background=True, **body)
    assert queued.status_code == 200, queued.text
    assert queued.json()["status"] == "queued" and queued.json()["background"] is True
    assert queued.json()["output"] == [] and time.monotonic() - t0 < 2
    done = finished(srv, queued.json()["id"])
    assert done["status"] == foreground["status"] and done["output"], done
    assert text(done) == text(foreground)
    for count in ("input_tokens", "output_tokens"):
        assert done["usage"][count] == foreground["usage"][count]
    # its work is logged as a request of its own once it ends, with its tokens (its POST answered
    # `queued` with none, and the work was in no access line nor audit record)
    def work_lines() -> list[dict]:
        lines = [json.loads(line) for line in srv.log_path.read_text().splitlines() if done["id"] in line]
        return [line for line in lines if line.get("background")]

    work = wait_for(work_lines, timeout=10)
    assert len(work) == 1 and work[0]["status"] == 200 and work[0]["models"] == ["smol"], work
    assert (work[0]["prompt_tokens"], work[0]["completion_tokens"]) == (done["usage"]["input_tokens"],
                                                                       done["usage"]["output_tokens"])
    # and it continues as a stored response does
    went_on = post(srv, previous_response_id=done["id"], input="Another one?", max_output_tokens=8)
    assert went_on.status_code == 200 and went_on.json()["usage"]["input_tokens"] > done["usage"]["input_tokens"]


def test_a_group_answers_in_the_background_as_in_the_foreground(srv):
    body = {"model": "chain", "input": "Name a fruit.", "max_output_tokens": 8}
    foreground = post(srv, **body).json()
    done = finished(srv, post(srv, background=True, **body).json()["id"])
    assert done["status"] == foreground["status"] and text(done) == text(foreground) != "", done


def test_the_openai_sdk_polls_and_cancels_a_background_response(srv):
    client = openai.OpenAI(base_url=srv.base + "/v1", api_key="none", max_retries=0, timeout=120)
    made = client.responses.create(model="smol", input="Tell me a long story.", text=LONG, max_output_tokens=900,
                                   temperature=0, background=True)
    assert made.status == "queued" and made.background
    wait_for(lambda: client.responses.retrieve(made.id).status == "in_progress" and sched(srv)["running"] == 1)
    before = sched(srv)["decode_tokens"]
    cancelled = client.responses.cancel(made.id)
    assert cancelled.status == "cancelled", cancelled
    assert client.responses.retrieve(made.id).status == "cancelled"
    wait_for(lambda: sched(srv)["running"] == 0, timeout=5)
    stopped = sched(srv)["decode_tokens"]
    assert stopped - before < 450  # it stopped well short of the 900 tokens it was asked for
    time.sleep(0.5)
    assert sched(srv)["decode_tokens"] == stopped
    again = client.responses.cancel(made.id)  # a finished response comes back as it is
    assert again.status == "cancelled"


def test_a_queued_response_is_cancelled_without_disturbing_the_request_ahead_of_it(srv):
    """One slot: a streamed chat answer holds it, the background response waits for it, is
    cancelled while it waits, and the chat answer goes on to its end."""
    def long_chat() -> int:
        with httpx.stream("POST", srv.base + "/v1/chat/completions", timeout=120, json={
                "model": "smol", "messages": [{"role": "user", "content": "Tell me a story."}], "max_tokens": 600,
                "temperature": 0, "stream": True, "logit_bias": {"2": -100}}) as r:
            return sum(1 for line in r.iter_lines() if line.startswith("data: {") and '"content"' in line)

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        chat = pool.submit(long_chat)
        wait_for(lambda: sched(srv)["running"] == 1)
        queued = post(srv, background=True, input="Name a fruit.", max_output_tokens=8).json()
        wait_for(lambda: get(srv, queued["id"])["status"] == "in_progress" and sched(srv)["queued"] == 1)
        follow = post(srv, previous_response_id=queued["id"], input="And another?")
        assert follow.status_code == 400 and follow.json()["error"]["code"] == "previous_response_in_progress"
        r = httpx.post(f"{srv.base}/v1/responses/{queued['id']}/cancel", timeout=30)
        assert r.status_code == 200 and r.json()["status"] == "cancelled" and r.json()["output"] == [], r.text
        assert sched(srv)["queued"] == 0
        assert chat.result(timeout=120) >= 590  # every token of its answer


@pytest.mark.parametrize("body,param", [
    ({"input": "Hi", "background": True, "store": False}, "background"),
    ({"input": GPL[:20000], "background": True, "stream": True}, "input"),  # before the stream starts
    ({"input": "Hi", "background": True, "model": "nope"}, "model"),
    ({"input": GPL[:20000], "background": True}, "input"),  # over the context: refused before it starts
    ({"input": "Hi", "background": True, "max_output_tokens": 1020}, "max_output_tokens"),
])
def test_bad_background_requests_name_the_field(srv, body, param):
    r = post(srv, **body)
    assert r.status_code in (400, 404) and r.json()["error"]["param"] == param, r.text


def test_only_a_stored_background_response_is_cancelled(srv):
    made = post(srv, input="Hi", max_output_tokens=2).json()
    r = httpx.post(f"{srv.base}/v1/responses/{made['id']}/cancel")
    assert r.status_code == 400 and r.json()["error"]["param"] == "response_id", r.text
    r = httpx.post(f"{srv.base}/v1/responses/resp_nothing/cancel")
    assert r.status_code == 404 and r.json()["error"]["code"] == "response_not_found"


def test_a_drain_ends_a_background_response_and_a_killed_one_reads_as_failed(server_factory, tmp_path):
    """SIGTERM while a background response runs: the drain counts it as a request in flight and,
    its grace over, ends it as failed (were it not counted, the process would end at once and
    leave it unfinished); after a kill -9 a response in progress reads as failed at the next start."""
    config = {"server": {"state_dir": str(tmp_path), "drain_grace_s": 2},
              "models": [model_entry("smol", SMOLLM2, n_ctx=1024, n_parallel=1)]}
    first = server_factory(config, "background-drain")
    long = post(first, background=True, input="Tell me a long story.", text=LONG, max_output_tokens=900).json()
    wait_for(lambda: sched(first)["running"] == 1)
    first.stop()  # it needs 500 tokens or more (its string's minLength): past the grace
    assert "draining: 1 requests in flight" in first.log_path.read_text()
    second = server_factory(config, "background-kill")
    ended = get(second, long["id"])
    assert ended["status"] == "failed" and ended["error"]["code"] == "shutting_down", ended
    killed = post(second, background=True, input="Tell me a story.", text=LONG, max_output_tokens=900).json()
    wait_for(lambda: sched(second)["running"] == 1)
    second.proc.kill()
    second.proc.wait()
    third = server_factory(config, "background-after")
    lost = get(third, killed["id"])
    assert lost["status"] == "failed" and lost["error"]["code"] == "server_restarted", json.dumps(lost)


def test_a_client_gone_while_queued_ends_its_request(srv):
    """A request waiting for the slot whose client goes away ends then (it used to wait, counted
    in flight, for an end the runner never sent once it dropped the sequence)."""
    def in_flight() -> float:
        metrics = httpx.get(srv.base + "/metrics").text
        return float(next(line.split()[1] for line in metrics.splitlines() if line.startswith("eie_in_flight_requests ")))

    def long_chat() -> None:
        with httpx.stream("POST", srv.base + "/v1/chat/completions", timeout=120, json={
                "model": "smol", "messages": [{"role": "user", "content": "Tell me a story."}], "max_tokens": 600,
                "temperature": 0, "stream": True, "logit_bias": {"2": -100}}) as r:
            for _ in r.iter_lines():
                pass

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        chat = pool.submit(long_chat)
        wait_for(lambda: sched(srv)["running"] == 1)
        with pytest.raises(httpx.ReadTimeout):  # waits for the slot; the client gives up and closes
            httpx.post(srv.base + "/v1/responses", timeout=1, json={"model": "smol", "input": "Hi",
                                                                    "max_output_tokens": 4})
        wait_for(lambda: sched(srv)["queued"] == 0, timeout=5)
        chat.result(timeout=120)
    wait_for(lambda: in_flight() == 0, timeout=5)


def each_event(lines):
    """The events of a server-sent event stream as they come, each checked against its `event:` line."""
    name = None
    for line in lines:
        if line.startswith("event: "):
            name = line[len("event: "):]
        elif line.startswith("data: "):
            event = json.loads(line[len("data: "):])
            assert event["type"] == name, line
            yield event


def events_of(lines) -> list[dict]:
    return list(each_event(lines))


def replay(srv, response_id: str, after: int | None = None) -> list[dict]:
    query = "" if after is None else f"&starting_after={after}"
    with httpx.stream("GET", f"{srv.base}/v1/responses/{response_id}?stream=true{query}", timeout=120) as r:
        assert r.status_code == 200, r.read()
        return events_of(r.iter_lines())


def streamed_text(events: list[dict]) -> str:
    return "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")


def test_a_streamed_background_response_goes_on_without_its_client_and_is_read_again(srv):
    """background + stream: the POST streams the events; its client goes away after five, the
    response goes on to its end; a GET with stream=true follows it live from the sixth and reads
    the whole stream again once it is done, the same events with the same sequence numbers."""
    body = {"input": "Name three colors.", "max_output_tokens": 300, "text": LONG}
    with httpx.stream("POST", srv.base + "/v1/responses", timeout=120,
                      json={"model": "smol", "temperature": 0, "background": True, "stream": True, **body}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = each_event(r.iter_lines())
        first = [next(events) for _ in range(5)]
    response_id = first[0]["response"]["id"]
    assert [e["type"] for e in first[:3]] == ["response.created", "response.queued", "response.in_progress"]
    assert first[0]["response"]["status"] == first[1]["response"]["status"] == "queued"
    assert first[2]["response"]["status"] == "in_progress"
    with httpx.stream("GET", f"{srv.base}/v1/responses/{response_id}?stream=true&starting_after=4",
                      timeout=120) as r:
        events = each_event(r.iter_lines())
        rest = [next(events)]
        assert get(srv, response_id)["status"] == "in_progress"  # followed live
        rest += list(events)
    whole = replay(srv, response_id)
    assert whole == first + rest
    assert [e["sequence_number"] for e in whole] == list(range(len(whole)))
    assert whole[-1]["type"] == "response.incomplete"  # 300 tokens of a 2000-character story
    done = get(srv, response_id)
    assert whole[-1]["response"] == done and streamed_text(whole) == text(done) != ""
    assert replay(srv, response_id, after=len(whole) - 3) == whole[-2:]
    assert replay(srv, response_id, after=len(whole) + 10) == []
    foreground = post(srv, **body).json()
    assert text(foreground) == text(done)


def test_the_openai_sdk_streams_a_background_response_and_picks_it_up_again(srv):
    client = openai.OpenAI(base_url=srv.base + "/v1", api_key="none", max_retries=0, timeout=120)
    stream = client.responses.create(model="smol", input="Name a fruit.", max_output_tokens=40, temperature=0,
                                     background=True, stream=True)
    seen = []
    for event in stream:
        seen.append(event)
        if event.sequence_number == 4:
            break
    stream.close()
    response_id = seen[0].response.id
    resumed = list(client.responses.retrieve(response_id, stream=True, starting_after=4))
    assert resumed[0].sequence_number == 5 and resumed[-1].type in ("response.completed", "response.incomplete")
    with client.responses.stream(response_id=response_id) as again:  # the SDK's helper reads it from the start
        final = again.get_final_response()
    assert final.id == response_id and final.output_text == client.responses.retrieve(response_id).output_text != ""


def test_a_cancelled_stream_ends_and_its_events_stay_readable(srv):
    with httpx.stream("POST", srv.base + "/v1/responses", timeout=120, json={
            "model": "smol", "input": "Tell me a long story.", "text": LONG, "max_output_tokens": 900,
            "background": True, "stream": True}) as r:
        events = each_event(r.iter_lines())
        head = [next(events)]
        while head[-1]["type"] != "response.output_text.delta":
            head.append(next(events))
        cancelled = httpx.post(f"{srv.base}/v1/responses/{head[0]['response']['id']}/cancel", timeout=30).json()
        assert cancelled["status"] == "cancelled", cancelled
        tail = list(events)  # the stream ends
    whole = head + tail
    assert whole[-1]["type"] == "response.output_text.delta"  # no final event
    assert replay(srv, cancelled["id"]) == whole


@pytest.mark.parametrize("query,param", [
    ("stream=yes", "stream"), ("stream=true&starting_after=-1", "starting_after"),
    ("stream=true&starting_after=x", "starting_after")])
def test_bad_stream_queries_name_the_field(srv, query, param):
    made = post(srv, input="Hi", max_output_tokens=2, background=True, stream=True)
    response_id = events_of(made.text.splitlines())[0]["response"]["id"]
    r = httpx.get(f"{srv.base}/v1/responses/{response_id}?{query}")
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_only_a_streamed_background_response_streams_again(srv):
    for body, why in (({}, "not made in the background"), ({"background": True}, "made without stream")):
        made = post(srv, input="Hi", max_output_tokens=2, **body).json()
        finished(srv, made["id"])
        r = httpx.get(f"{srv.base}/v1/responses/{made['id']}?stream=true")
        assert r.status_code == 400 and why in r.json()["error"]["message"], r.text
        assert r.json()["error"]["param"] == "stream"


def test_background_work_counts_against_its_key_and_its_events_outlive_a_restart(server_factory, tmp_path):
    """concurrent_requests 1: a background response holds its POST's place until it ends (here
    cancelled); a streamed one's events are stored with it and read the same after a restart."""
    config = {"server": {"state_dir": str(tmp_path), "limits": {"concurrent_requests": 1}},
              "models": [model_entry("smol", SMOLLM2, n_ctx=1024, n_parallel=2)]}
    first = server_factory(config, "background-limits")
    long = post(first, background=True, input="Tell me a long story.", text=LONG, max_output_tokens=900).json()
    refused = post(first, input="Hi", max_output_tokens=2)
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "concurrent_requests", refused.text
    assert httpx.post(f"{first.base}/v1/responses/{long['id']}/cancel", timeout=30).json()["status"] == "cancelled"
    made = post(first, input="Name a fruit.", max_output_tokens=12, background=True, stream=True)
    assert made.status_code == 200, made.text
    events = events_of(made.text.splitlines())
    assert events[-1]["type"] in ("response.completed", "response.incomplete")
    first.stop()
    second = server_factory(config, "background-replayed")
    assert replay(second, events[0]["response"]["id"]) == events


def test_a_background_response_refused_for_a_full_queue_waits_its_turn(server_factory, tmp_path):
    """One slot, no queue: a background response that comes while a chat answer holds the slot
    is refused by the model (queue_full) and asks again until it runs (it used to be stored failed)."""
    srv = server_factory({"server": {"state_dir": str(tmp_path)},
                          "models": [model_entry("smol", SMOLLM2, n_ctx=1024, n_parallel=1, max_queue=0)]},
                         "background-queue-full")
    with httpx.stream("POST", srv.base + "/v1/chat/completions", timeout=120, json={
            "model": "smol", "messages": [{"role": "user", "content": "Tell me a story."}], "max_tokens": 300,
            "temperature": 0, "stream": True, "logit_bias": {"2": -100}}) as r:
        lines = r.iter_lines()
        next(lines)
        made = post(srv, background=True, input="Name a fruit.", max_output_tokens=8).json()
        time.sleep(1)
        assert get(srv, made["id"])["status"] == "in_progress"
        for _ in lines:
            pass
    done = finished(srv, made["id"])
    assert done["status"] in ("completed", "incomplete") and text(done), done
