"""A file is parsed once however many requests ask for it at the same time (the app's
model bar and its Memory page both plan a new model at once; Gemma's 262k vocabulary
took seconds per parse, and three parses at once timed requests out)."""

import threading
import time

from engine.catalog import gguf_file


def test_concurrent_inspections_of_a_new_file_parse_it_once(tiny_model, monkeypatch):
    parsed, gate = [], threading.Event()
    real = gguf_file._parse

    def slow_parse(path):
        parsed.append(path)
        gate.wait(5)  # the others arrive while this one parses
        return real(path)

    monkeypatch.setattr(gguf_file, "_parse", slow_parse)
    inspector, seen = gguf_file.GGUFInspector(), []
    threads = [threading.Thread(target=lambda: seen.append(inspector.inspect(tiny_model)))
               for _ in range(4)]
    for thread in threads:
        thread.start()
    time.sleep(0.3)  # lets the others reach inspect (a pass never depends on this)
    gate.set()
    for thread in threads:
        thread.join(10)
    assert len(parsed) == 1 and len(seen) == 4
    assert len({info.vocab_hash for info in seen}) == 1
