"""``LLM.chat``'s vLLM arguments: ``tools`` and ``chat_template_kwargs`` reach the template, and
``continue_final_message`` continues the last assistant message; each gives the tokens of the prompt it should
render, and their misuse is a ValueError that says what to change."""

from __future__ import annotations

import pytest

from brisk import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
TEMPLATE = (
    "{% if greeting %}{{ greeting }} {% endif %}{% for tool in tools or [] %}[{{ tool['function']['name'] }}]"
    "{% endfor %}{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {}}}}


@pytest.fixture(scope="module")
def llm(tiny_llama):
    return LLM(tiny_llama, device="cpu", max_model_len=256)


def tokens_of(llm, text: str) -> list[int]:
    ids = llm.get_tokenizer().encode(text, add_special_tokens=False)
    return llm.generate([ids], GREEDY, use_tqdm=False)[0].outputs[0].token_ids


def test_tools_and_template_kwargs_reach_the_template(llm):
    out = llm.chat(
        [{"role": "user", "content": "hello"}], GREEDY, chat_template=TEMPLATE, use_tqdm=False, tools=[TOOL],
        chat_template_kwargs={"greeting": "Hi"},
    )  # fmt: skip
    expected = "Hi [get_weather]<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"
    assert out[0].prompt_token_ids == llm.get_tokenizer().encode(expected, add_special_tokens=False)
    assert out[0].outputs[0].token_ids == tokens_of(llm, expected)


def test_continue_final_message(llm):
    conversation = [{"role": "user", "content": "Name a city."}, {"role": "assistant", "content": "The city is"}]
    out = llm.chat(conversation, GREEDY, add_generation_prompt=False, continue_final_message=True, use_tqdm=False)
    expected = "<|im_start|>user\nName a city.<|im_end|>\n<|im_start|>assistant\nThe city is"
    assert out[0].prompt_token_ids == llm.get_tokenizer().encode(expected, add_special_tokens=False)


def test_a_conversation_with_tool_calls(llm):
    """An assistant turn that only calls a tool (no content) renders, its JSON-string arguments reaching the
    template as an object (the template serializes them once), and ``developer`` as ``system``, as the server does."""
    template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m.get('tool_calls') %}"
        "{{ m['tool_calls'][0]['function']['arguments'] | tojson }}{% else %}{{ m['content'] }}{% endif %}"
        "<|im_end|>\n{% endfor %}<|im_start|>assistant\n"
    )
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    conversation = [
        {"role": "developer", "content": "Be brief."},
        {"role": "assistant", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    ]
    out = llm.chat(conversation, GREEDY, chat_template=template, use_tqdm=False)
    expected = (
        '<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>assistant\n{"city": "Paris"}<|im_end|>\n'
        "<|im_start|>tool\nsunny<|im_end|>\n<|im_start|>assistant"  # Jinja drops a template's last newline
    )
    assert out[0].prompt_token_ids == llm.get_tokenizer().encode(expected, add_special_tokens=False)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"continue_final_message": True}, "pass add_generation_prompt=False"),
        ({"continue_final_message": True, "add_generation_prompt": False}, "end with an assistant message"),
        ({"chat_template_kwargs": {"tools": []}}, r"cannot set \['tools'\]"),
        ({"chat_template_kwargs": {"continue_final_message": True}}, r"cannot set \['continue_final_message'\]"),
    ],
)
def test_misuse_says_what_to_change(llm, kwargs, match):
    with pytest.raises(ValueError, match=match):
        llm.chat([{"role": "user", "content": "hi"}], GREEDY, use_tqdm=False, **kwargs)
    assert not llm.engine.has_unfinished_requests()
