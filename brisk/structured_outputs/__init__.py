"""Structured outputs: constrain sampling to a JSON schema, a regex, a list of choices or an EBNF grammar.

A grammar engine made for this (xgrammar) compiles each constraint against the tokenizer's vocabulary once (in a
thread pool, cached by constraint), and a per-request matcher gives, before each sampled token, the bitmask of
tokens the grammar allows; the sampler masks the logits of the whole batch with it.
"""

from brisk.structured_outputs.params import StructuredOutputsParams

__all__ = ["StructuredOutputsParams"]
