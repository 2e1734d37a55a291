"""A long chat prompt tokenized a turn at a time (engine/llama/vocab.py: TurnTokens) gives
exactly the tokens of the whole text, for a byte-level BPE vocabulary (SmolLM2's) and a
SentencePiece one (Gemma 3's), special tokens in odd places included; a turn seen before is
not tokenized again."""

from __future__ import annotations

import random

import pytest

from engine.llama import vocab as vocab_module
from engine.llama.vocab import SEGMENTED_FROM, Vocabulary, _tokenize
from support.models import GEMMA, STARTER

WORDS = ("tool", "schema", " the", "\n", "  ", "\t", "é", "日本", "🙂", "{\"a\": 1}", "<|im_end|>",
         "<start_of_turn>", "<end_of_turn>", "<|im_start|>", "user", "model", ".", "\n\n")


def chat(rng: random.Random, opener: str, closer: str, turns: int) -> str:
    def words(n):
        return "".join(rng.choice(WORDS) for _ in range(n))
    text = f"{opener}system\n{words(2000)}{closer}\n"
    for i in range(turns):
        role = ("user", "assistant", "model")[i % 3]
        text += f"{opener}{role}\n{words(rng.randint(0, 60))}{closer}\n"
    return text


@pytest.mark.parametrize("model, opener, closer", [
    (STARTER, "<|im_start|>", "<|im_end|>"), (GEMMA, "<start_of_turn>", "<end_of_turn>")])
def test_a_turn_at_a_time_is_the_whole_texts_tokens(starters_dir, model, opener, closer):
    vocabulary = Vocabulary(starters_dir / f"{model}.gguf")
    try:
        assert vocabulary._turns is None or vocabulary._turns.segmentable
        for seed in range(12):
            text = chat(random.Random(seed), opener, closer, turns=seed + 2)
            assert len(text) >= SEGMENTED_FROM
            whole = _tokenize(vocabulary.vocab, text, False, True)
            assert vocabulary.tokenize(text, parse_special=True) == whole, seed
            assert vocabulary.tokenize(text, parse_special=True) == whole, seed  # cached
            # the leading text before the first turn, and a turn's opener in the text
            shifted = "  preamble " + text.replace("\n", f" {opener} ", 3)
            assert vocabulary.tokenize(shifted, parse_special=True) == \
                _tokenize(vocabulary.vocab, shifted, False, True), seed
        assert vocabulary._turns.segmentable and vocabulary._turns._markers[opener] is True
    finally:
        vocabulary.close()


def test_a_turn_seen_before_is_not_tokenized_again(starters_dir, monkeypatch):
    vocabulary = Vocabulary(starters_dir / f"{STARTER}.gguf")
    try:
        first = chat(random.Random(0), "<|im_start|>", "<|im_end|>", turns=4)
        vocabulary.tokenize(first, parse_special=True)
        vocabulary.tokenize(first, parse_special=True)  # the marker checked, pieces held
        seen = []
        real = vocab_module._tokenize
        monkeypatch.setattr(vocab_module, "_tokenize",
                            lambda v, text, *a: seen.append(text) or real(v, text, *a))
        later = first + "<|im_start|>user\nand then?<|im_end|>\n"
        tokens = vocabulary.tokenize(later, parse_special=True)
        assert tokens == real(vocabulary.vocab, later, False, True)
        # the new turn, and the first 512 characters (to find the marker): not the rest
        assert sum(len(t) for t in seen) < 600, [len(t) for t in seen]
    finally:
        vocabulary.close()


def test_a_marker_another_special_token_holds_is_never_trusted(starters_dir):
    """Gemma's "\\n" is a user-defined token, and so is "\\n\\n" (llama.cpp matches the
    longer first): a first text without paragraphs once made "\\n" trusted, and every
    later prompt with paragraphs tokenized "\\n", "\\n" where the whole gives "\\n\\n"."""
    vocabulary = Vocabulary(starters_dir / f"{GEMMA}.gguf")
    try:
        lines = "a line of the log\n" * 600  # "\n" recurs; no paragraph in it
        paragraphs = "A paragraph of prose.\n\nAnother one, after it.\n\n" * 300
        for text in (lines, paragraphs, lines + paragraphs):
            assert len(text) >= SEGMENTED_FROM
            assert vocabulary.tokenize(text, parse_special=True) == \
                _tokenize(vocabulary.vocab, text, False, True)
        assert vocabulary._turns._markers.get("\n") is not True
    finally:
        vocabulary.close()


def test_what_is_kept_is_bounded_in_bytes(starters_dir, monkeypatch):
    """Turns' texts and tokens together, and a turn too large to keep is not kept."""
    monkeypatch.setattr(vocab_module, "HELD_BYTES", 64 << 10)
    monkeypatch.setattr(vocab_module, "HELD_PIECE", 16 << 10)
    vocabulary = Vocabulary(starters_dir / f"{STARTER}.gguf")
    try:
        for seed in range(6):
            text = chat(random.Random(seed), "<|im_start|>", "<|im_end|>", turns=30)
            assert vocabulary.tokenize(text, parse_special=True) == \
                _tokenize(vocabulary.vocab, text, False, True)
        held = vocabulary._turns.held
        assert 0 < held.used <= 64 << 10 and len(held) > 1
        assert all(len(piece) < 16 << 10 for piece in held)
    finally:
        vocabulary.close()
