"""Incremental detokenization: the fast decoder gives transformers' text, and streamed text adds up to the whole."""

import random

import pytest
from transformers import AutoTokenizer

from brisk.engine.detokenizer import IncrementalDetokenizer, fast_decoder
from tests.tiny_models import build_tokenizer


@pytest.fixture(scope="module", params=["tiny-bpe", "tiny-bpe-cleanup"])
def tokenizer(request, tmp_path_factory):
    tok = build_tokenizer()
    tok.clean_up_tokenization_spaces = request.param.endswith("cleanup")  # with clean-up: the wrapper's path
    folder = tmp_path_factory.mktemp(request.param)
    tok.save_pretrained(folder)
    return AutoTokenizer.from_pretrained(folder)


@pytest.mark.parametrize("skip_special_tokens", [True, False])
def test_fast_decoder_matches_transformers(tokenizer, skip_special_tokens):
    rng = random.Random(0)
    decode = fast_decoder(tokenizer, skip_special_tokens)
    for _ in range(300):
        ids = [rng.randrange(len(tokenizer)) for _ in range(rng.randint(1, 12))]
        assert decode(ids) == tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)


def test_streamed_text_adds_up(tokenizer):
    rng = random.Random(1)
    prompt = tokenizer.encode("Once upon a time")
    for _ in range(20):
        generated = [rng.randrange(len(tokenizer)) for _ in range(40)]
        detok = IncrementalDetokenizer(tokenizer, prompt, [], skip_special_tokens=True)
        for token in generated:
            detok.append(token, check_stop=False)
        detok.flush()
        # Byte-level BPE decodes piecewise: the context's text plus the streamed text is the whole text.
        context = tokenizer.decode(prompt[-5:], skip_special_tokens=True)
        assert context + detok.text == tokenizer.decode(prompt[-5:] + generated, skip_special_tokens=True)


def test_a_short_stop_before_min_tokens_does_not_count_beside_a_long_one(tokenizer):
    """Under min_tokens stops are not checked; once they are, only a match ending in the new text counts, for
    each stop string by its own length (a longer stop string beside it used to widen the search backwards)."""
    prompt = tokenizer.encode("Once upon a time")
    ids = tokenizer.encode(" the fox", add_special_tokens=False) + tokenizer.encode(" jumps", add_special_tokens=False)
    first = len(tokenizer.encode(" the fox", add_special_tokens=False))
    for stops in (["o"], ["o", "zzzzzzzzzzzz"]):
        detok = IncrementalDetokenizer(tokenizer, prompt, stops, skip_special_tokens=True)
        found = [detok.append(token, check_stop=i >= first) for i, token in enumerate(ids)]
        # " the fox" (its "o" under min_tokens) then " jumps": no "o" in the checked text
        assert found == [None] * len(ids) and detok.text.endswith("jumps"), stops
