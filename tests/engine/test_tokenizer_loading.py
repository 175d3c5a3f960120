"""The tokenizer loads on a thread beside the engine's start-up, handing the interpreter lock over more often
meanwhile, and the process's switch interval comes back once it is loaded, whether it loaded or failed."""

import sys

import pytest

from brisk.engine.tokenizer import LOADING_SWITCH_INTERVAL_S, load_tokenizer_in_background


@pytest.mark.parametrize("loads", [True, False], ids=["loads", "fails"])
def test_switch_interval_is_short_while_loading_then_restored(tiny_llama, tmp_path, loads):
    default = sys.getswitchinterval()
    assert default > LOADING_SWITCH_INTERVAL_S
    folder = tiny_llama if loads else tmp_path
    (tmp_path / "tokenizer.json").write_text("{not json")  # a tokenizer file that fails to load
    future = load_tokenizer_in_background(folder)
    assert sys.getswitchinterval() == pytest.approx(LOADING_SWITCH_INTERVAL_S) or future.done()
    if loads:
        assert future.result().encode("hello")
    else:
        with pytest.raises(ValueError, match="Cannot load a tokenizer"):
            future.result()
    assert sys.getswitchinterval() == default
