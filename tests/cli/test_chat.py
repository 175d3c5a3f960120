"""``brisk chat`` end to end: turns come from stdin, the history is kept, /reset clears it, EOF quits."""

from __future__ import annotations

import re

PROMPT = re.compile(r"\[prompt, \d+ tokens\]\n(.*?)\n\[end of prompt\]", re.DOTALL)


def test_chat_keeps_history_and_resets(cli):
    turns = "What is the capital of France?\nAnd of Germany?\n/reset\nAnd of Germany?\n"
    proc = cli("chat", "--temperature", "0", "--max-tokens", "16", "--verbose", stdin=turns)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    prompts = PROMPT.findall(proc.stderr)  # --verbose shows each turn's templated prompt on stderr
    assert len(prompts) == 3, proc.stderr

    # Turn 2's prompt holds the whole first exchange, and turn 1's reply is what was printed first.
    first, second, after_reset = prompts
    assert "What is the capital of France?" in first and "Germany" not in first
    match = re.search(r"What is the capital of France\?.*?assistant\n(.+?)<\|im_end\|>", second, re.DOTALL)
    assert match, second
    reply1 = match.group(1)
    assert "Paris" in reply1
    assert proc.stdout.startswith(reply1 + "\n")
    assert second.rstrip().endswith("And of Germany?<|im_end|>\n<|im_start|>assistant")
    assert "France" not in after_reset and "And of Germany?" in after_reset

    # With the history, the follow-up question is understood (greedy SmolLM2: "The capital of Germany is Berlin.");
    # asked alone after /reset it is not about a capital at all.
    replies = proc.stdout[len(reply1) + 1 :]
    reply2 = replies[: replies.index("\n")]
    assert "Berlin" in reply2
    assert proc.stdout.endswith("\n") and len(proc.stdout.splitlines()) >= 3
