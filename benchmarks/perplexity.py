"""Perplexity of a real model in each weight and KV-cache format brisk runs, against its unquantized weights.

    python benchmarks/perplexity.py --model smollm2-135m-instruct [--formats base fp8 w4a16 ...] \
        [--group-size 32] [--calibration-samples 64] [--weight-observer memoryless_mse] [--max-tokens 50035] \
        [--window 1024] [--json FILE]

The text is the Book of Genesis, King James Version (public domain; ``benchmarks/data/kjv-genesis.txt``), cut
into windows of ``--window`` tokens that are scored independently: perplexity = exp(mean negative log-likelihood
of every token but each window's first), from brisk's prompt logprobs. Each format is a checkpoint made from the
model's unquantized folder as its library makes it (compressed-tensors presets for FP8, W8A8, W8A16, W4A16 and
NVFP4, in groups of 128 inputs where the sizes allow, else 64, or ``--group-size``), or the GPTQ and AWQ layouts as
the tests write them (round-to-nearest: no calibration data, so they show the format's rounding, not GPTQ's error
feedback), or an engine option (``fp8``: weights quantized while loading; ``fp8-kv``: the FP8 KV cache). ``base`` is
the unquantized model (float32 on the CPU, bfloat16 on a GPU). Prints one row per format with its change against
``base``.

``gptq-w4-calibrated``, ``gptq-w4-asym-calibrated`` and ``awq-w4-calibrated`` are 4-bit checkpoints made the way
users make them: llmcompressor's ``oneshot`` with ``GPTQModifier`` (W4A16, symmetric, or W4A16_ASYM with zero
points) or ``AWQModifier`` then ``QuantizationModifier`` (W4A16_ASYM),
on every Linear but the LM head, in the groups above, saved as compressed-tensors. Their calibration text is not
the scored text but English prose that every Python install has offline: the standard library's pydoc topics
(``pydoc_data.topics``), joined, tokenized and cut into ``--calibration-samples`` samples (64 by default) of
``CALIBRATION_LENGTH`` tokens. ``--weight-observer`` picks how llmcompressor sets their weights' scales and zero
points (its default: each group's minimum and maximum; ``memoryless_mse``: the clipping of each group that
minimizes its squared rounding error, as AutoAWQ's clipping search does after its scaling). They need ``pip install
llmcompressor``; its AWQ (0.14.0.1) page-locks its cached activations, which fails on a machine without an
accelerator, so there the script leaves the page-locking out (its grid search then takes about 8 s a point on one
core of a 2-core machine for SmolLM2-135M: 20 points x 4 mappings x 30 layers, hours).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run from a checkout without installing

from brisk import LLM, SamplingParams  # noqa: E402
from brisk.loader.resolve import resolve_model  # noqa: E402

TEXT = REPO / "benchmarks" / "data" / "kjv-genesis.txt"

# format -> (how the checkpoint is made, engine keyword arguments)
CT_PRESETS = {
    "fp8-dynamic": "FP8_DYNAMIC",
    "w8a8": "W8A8",
    "w8a16": "W8A16",
    "w4a16": "W4A16",
    "nvfp4": "NVFP4A16",
}
GROUPED = ("w8a16", "w4a16", "gptq-w4")
CALIBRATED = {  # format -> llmcompressor scheme
    "gptq-w4-calibrated": "W4A16",
    "gptq-w4-asym-calibrated": "W4A16_ASYM",
    "awq-w4-calibrated": "W4A16_ASYM",
}
FORMATS = ["base", "fp8", "fp8-kv", *CT_PRESETS, "gptq-w4", "awq-w4", *CALIBRATED]
# 64 x 512 = 32,768 of the pydoc topics' ~113k tokens: enough for GPTQ's Hessians and AWQ's activation scales
# on these small models, and GPTQ calibrates SmolLM2-135M in about 5 minutes on two CPU cores.
CALIBRATION_SAMPLES = 64
CALIBRATION_LENGTH = 512


GROUP_SIZE: int | None = None  # --group-size: the groups of every grouped and calibrated format when set
WEIGHT_OBSERVER: str | None = None  # --weight-observer: the calibrated formats' llmcompressor observer when set


def group_size(base: str) -> int:
    """``GROUP_SIZE``, else the largest of 128, 64, 32 that divides the hidden and MLP sizes (SmolLM2's 576 takes
    64)."""
    if GROUP_SIZE is not None:
        return GROUP_SIZE
    config = json.loads((Path(base) / "config.json").read_text())
    sizes = (config["hidden_size"], config["intermediate_size"])
    return next(g for g in (128, 64, 32) if all(size % g == 0 for size in sizes))


def checkpoint(fmt: str, base: str, scratch: Path) -> tuple[str, dict]:
    """The folder and the engine arguments that run ``base`` in format ``fmt``."""
    if fmt == "base":
        return base, {}
    if fmt == "fp8":
        return base, {"quantization": "fp8"}
    if fmt == "fp8-kv":
        return base, {"kv_cache_dtype": "fp8"}
    out = scratch / fmt
    if fmt in CT_PRESETS:
        from tests.quantization.ct_checkpoints import make_ct_checkpoint

        weight_args = {"group_size": group_size(base)} if fmt in GROUPED else {}
        return make_ct_checkpoint(base, out, CT_PRESETS[fmt], **weight_args), {}
    if fmt == "gptq-w4":
        from tests.quantization.gptq_checkpoints import make_gptq_checkpoint

        return make_gptq_checkpoint(base, out, bits=4, group_size=group_size(base), desc_act=False, sym=True)[0], {}
    if fmt == "awq-w4":
        from tests.quantization.awq_checkpoints import make_awq_checkpoint

        return make_awq_checkpoint(base, out, zero_point=True), {}
    if fmt in CALIBRATED:
        return calibrated_checkpoint(fmt, base, out), {}
    raise ValueError(f"unknown format {fmt!r}; choose from {FORMATS}")


def calibrated_checkpoint(fmt: str, base: str, out: Path) -> str:
    """``base`` quantized by llmcompressor's ``oneshot`` with GPTQ or AWQ on the pydoc topics, saved compressed
    into ``out``."""
    from pydoc_data.topics import topics

    from compressed_tensors.quantization import preset_name_to_scheme
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import GPTQModifier, QuantizationModifier
    from llmcompressor.modifiers.transform import AWQModifier
    from torch.utils.data import DataLoader
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tests.quantization.ct_checkpoints import copy_tokenizer

    ids = AutoTokenizer.from_pretrained(base)("\n\n".join(topics.values())).input_ids
    n = CALIBRATION_LENGTH
    samples = [{"input_ids": torch.tensor(ids[i * n : (i + 1) * n])} for i in range(CALIBRATION_SAMPLES)]
    scheme = preset_name_to_scheme(CALIBRATED[fmt], ["Linear"])
    scheme.weights.group_size = group_size(base)
    scheme.weights.observer = WEIGHT_OBSERVER or scheme.weights.observer
    quantize = {"config_groups": {"group_0": scheme}, "ignore": ["lm_head"]}
    recipe = [GPTQModifier(**quantize)] if fmt.startswith("gptq") else [AWQModifier(), QuantizationModifier(**quantize)]
    if not fmt.startswith("gptq") and not torch.accelerator.is_available():
        # AWQ page-locks its cached activations to speed their copies to an accelerator; with none there is
        # nothing to copy to, and page-locking fails, so it is left out.
        from llmcompressor.pipelines.cache import IntermediatesCache

        IntermediatesCache.pin_memory = lambda self, batch_index, input_names=None: None
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    oneshot(model=model, dataset=DataLoader(samples), recipe=recipe)  # batches of one sample, as oneshot's default
    model.save_pretrained(out, save_compressed=True)
    copy_tokenizer(base, out)
    return str(out)


def perplexity(llm: LLM, windows: list[list[int]]) -> tuple[float, int]:
    """exp(mean NLL) over every token of ``windows`` but their first, and how many tokens that is."""
    params = SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=0)
    nll, count = 0.0, 0
    for window, out in zip(windows, llm.generate(windows, params, use_tqdm=False)):
        for token, position in zip(window[1:], out.prompt_logprobs[1:]):
            nll -= position[token].logprob
            count += 1
    return math.exp(nll / count), count


def main() -> None:
    global GROUP_SIZE, CALIBRATION_SAMPLES, WEIGHT_OBSERVER
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--formats", nargs="+", default=FORMATS, choices=FORMATS)
    parser.add_argument("--group-size", type=int, default=None, help="groups of the grouped and calibrated formats")
    parser.add_argument("--calibration-samples", type=int, default=CALIBRATION_SAMPLES,
                        help=f"samples of {CALIBRATION_LENGTH} tokens the calibrated formats see")  # fmt: skip
    parser.add_argument("--weight-observer", default=None,
                        help="the calibrated formats' llmcompressor weight observer (e.g. memoryless_mse)")  # fmt: skip
    parser.add_argument("--max-tokens", type=int, default=None, help="score at most this many tokens of the text")
    parser.add_argument("--window", type=int, default=1024)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    GROUP_SIZE, CALIBRATION_SAMPLES = args.group_size, args.calibration_samples
    WEIGHT_OBSERVER = args.weight_observer

    on_gpu = args.device != "cpu" and torch.cuda.is_available()
    dtype = torch.bfloat16 if on_gpu else torch.float32
    base = str(resolve_model(args.model, dtype))
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(base)(TEXT.read_text()).input_ids[: args.max_tokens]
    windows = [ids[i : i + args.window] for i in range(0, len(ids) - 1, args.window)]
    rows = []
    with tempfile.TemporaryDirectory(prefix="brisk-ppl-") as scratch:
        for fmt in args.formats:
            started = time.perf_counter()
            folder, engine_args = checkpoint(fmt, base, Path(scratch))
            llm = LLM(folder, device=args.device, dtype=str(dtype).removeprefix("torch."),
                      max_model_len=args.window + 1, kv_cache_memory_bytes=512 << 20, **engine_args)  # fmt: skip
            ppl, count = perplexity(llm, windows)
            del llm
            rows.append({"format": fmt, "perplexity": ppl, "tokens": count, "seconds": time.perf_counter() - started})
            change = f"{100 * (ppl / rows[0]['perplexity'] - 1):+.2f}%" if rows[0]["format"] == "base" else ""
            print(f"{fmt:12s} perplexity {ppl:9.4f}  {change:>8s}  ({count} tokens, {rows[-1]['seconds']:.0f} s)",
                  flush=True)  # fmt: skip
    if args.json:
        record = {"model": args.model, "window": args.window, "group_size": args.group_size,
                  "calibration_samples": args.calibration_samples, "weight_observer": args.weight_observer,
                  "rows": rows}  # fmt: skip
        Path(args.json).write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
