from appliance.engine.text import StopMatcher, TextStream


def feed_all(stops, pieces):
    m = StopMatcher(stops)
    out, hit = [], False
    for p in pieces:
        text, hit = m.feed(p)
        out.append(text)
        if hit:
            break
    if not hit:
        out.append(m.flush())
    return "".join(out), hit, out


def test_stop_string_split_across_tokens_is_never_emitted():
    text, hit, chunks = feed_all(["END"], ["Hello E", "N", "D and more"])
    assert (text, hit) == ("Hello ", True)
    assert all("E" not in c for c in chunks[1:])


def test_partial_match_that_fails_is_released():
    text, hit, _ = feed_all(["END"], ["Hello E", "NJOY", "!"])
    assert (text, hit) == ("Hello ENJOY!", False)


def test_earliest_of_several_stops_wins():
    text, hit, _ = feed_all(["two", "one"], ["zero one two"])
    assert (text, hit) == ("zero ", True)


def test_no_stops_passes_everything():
    assert feed_all([], ["a", "b"])[0] == "ab"


def test_utf8_split_across_tokens():
    data = "猫 and é".encode()
    stream = TextStream([])
    pieces = [data[i : i + 1] for i in range(len(data))]
    out = [stream.push(p)[0] for p in pieces]
    assert "".join(out) + stream.finish() == "猫 and é"
    assert all("\ufffd" not in o for o in out)


def test_invalid_utf8_becomes_replacement_at_the_end():
    stream = TextStream([])
    assert stream.push(b"ok\xe7")[0] == "ok"
    assert stream.finish() == "\ufffd"


def test_stop_held_text_flushed_at_finish():
    stream = TextStream(["###"])
    assert stream.push(b"abc#")[0] == "abc"
    assert stream.finish() == "#"
