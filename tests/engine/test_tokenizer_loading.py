"""The tokenizer loads on a thread beside the engine's start-up, handing the interpreter lock over more often
meanwhile, and the process's switch interval comes back once every load has ended, loaded or failed."""

import sys
import threading

import pytest

from brisk.engine.tokenizer import LOADING_SWITCH_INTERVAL_S, LOADING_THREAD_NAME, load_tokenizer_in_background


@pytest.fixture
def default_interval():
    for thread in threading.enumerate():  # loads that earlier tests started and left running
        if thread.name == LOADING_THREAD_NAME:
            thread.join()
    default = sys.getswitchinterval()
    assert default > LOADING_SWITCH_INTERVAL_S
    return default


def test_switch_interval_is_short_while_loading_then_restored(tiny_llama, tmp_path, default_interval):
    (tmp_path / "tokenizer.json").write_text("{not json")  # a tokenizer file that fails to load
    loads, fails = load_tokenizer_in_background(tiny_llama), load_tokenizer_in_background(tmp_path)
    assert sys.getswitchinterval() == pytest.approx(LOADING_SWITCH_INTERVAL_S) or (loads.done() and fails.done())
    assert loads.result().encode("hello")
    with pytest.raises(ValueError, match="Cannot load a tokenizer"):
        fails.result()
    assert sys.getswitchinterval() == default_interval  # after both overlapping loads, whichever ended first
