from engine.batching.text_stream import TextStream


def feed_all(stream, pieces):
    return "".join(stream.feed(p) for p in pieces) + stream.flush()


def test_multibyte_character_split_across_tokens():
    data = "héllo 👋".encode()
    assert feed_all(TextStream(), [data[i:i + 1] for i in range(len(data))]) == "héllo 👋"


def test_stop_string_split_across_tokens_is_cut():
    stream = TextStream(stop=("<|end|>",))
    emitted = [stream.feed(p) for p in [b"Hello <|", b"en", b"d|> more"]]
    assert emitted == ["Hello ", "", ""]
    assert stream.stopped and stream.flush() == ""


def test_partial_match_that_is_not_a_stop_is_released():
    stream = TextStream(stop=("STOP",))
    assert stream.feed(b"ab ST") == "ab "
    assert stream.feed(b"AY") == "STAY"
    assert not stream.stopped


def test_earliest_stop_wins():
    stream = TextStream(stop=("two", "one"))
    assert stream.feed(b"zero one two") == "zero "
