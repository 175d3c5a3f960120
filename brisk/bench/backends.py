"""The engines a benchmark can drive: brisk's ``LLM``, HF transformers ``generate`` (the in-process reference)
and an installed vLLM's ``LLM`` (the peer to beat).

Each exposes ``run(prompts, output_lens, temperature) -> RunResult``: one timed call over all the prompts, with
exact output lengths (brisk and vLLM: ``ignore_eos``; HF: no EOS token in the generation config).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from pathlib import Path

from brisk.bench.datasets import WARMUP_OUTPUT_LEN, warmup_prompts
from brisk.entrypoints.cli.engine_args import ENGINE_FLAGS

DEFAULT_HF_BATCH_SIZE = 128  # requests per static batch of HF transformers' generate


@dataclass
class RunResult:
    wall_s: float
    output_counts: list[int]  # tokens generated per request (what the request asked for)
    generated_tokens: int  # tokens the engine actually produced (HF static batches may produce more)
    ttft_s: list[float | None] = field(default_factory=list)  # engine-side, from RequestOutput.metrics
    decode_s: list[float | None] = field(default_factory=list)  # first token -> finished, engine-side
    cached_tokens: list[int] = field(default_factory=list)  # prompt tokens found in the prefix cache (brisk)


class BriskBackend:
    name = "brisk"

    def __init__(self, model: str, engine_kwargs: dict):
        from brisk import LLM

        start = time.perf_counter()
        self.llm = LLM(model=model, **engine_kwargs)
        self.init_s = time.perf_counter() - start

    @property
    def vocab_size(self) -> int:
        return int(self.llm.engine.model_config.hf_config.vocab_size)

    @property
    def max_model_len(self) -> int:
        return int(self.llm.engine.max_model_len)

    def describe(self) -> dict:
        engine = self.llm.engine
        info: dict = {"engine_init_s": round(self.init_s, 3)}
        probes = {
            "device": lambda: str(engine.device),
            "dtype": lambda: str(engine.model_config.dtype).removeprefix("torch."),
            "max_model_len": lambda: engine.max_model_len,
            "attention_backend": lambda: engine.attention_backend,
            "max_num_batched_tokens": lambda: engine.max_num_batched_tokens,
            "max_num_seqs": lambda: engine.args.max_num_seqs,
            "block_size": lambda: engine.args.block_size,
            "prefix_caching": lambda: engine.args.enable_prefix_caching,
            "enforce_eager": lambda: engine.args.enforce_eager,
            "async_scheduling": lambda: engine.async_scheduling,
            "kv_cache_blocks": lambda: engine.kv_cache_manager.pool.num_blocks,
            "kv_cache_tokens": lambda: engine.kv_cache_manager.pool.num_blocks * engine.args.block_size,
        }
        for key, probe in probes.items():
            with contextlib.suppress(AttributeError):  # the engine changed shape: report what can still be read
                info[key] = probe()
        with contextlib.suppress(AttributeError):
            if engine.speculative_config is not None:
                info["spec_decode"] = spec_decode_summary(engine.get_stats())
        return info

    def run(self, prompts: list[list[int]], output_lens: list[int], temperature: float) -> RunResult:
        from brisk import SamplingParams

        params = [
            SamplingParams(temperature=temperature, max_tokens=n, ignore_eos=True, detokenize=False)
            for n in output_lens
        ]
        start = time.perf_counter()
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        wall = time.perf_counter() - start
        counts = [len(o.outputs[0].token_ids) for o in outputs]
        ttft, decode = [], []
        for o in outputs:
            m = o.metrics
            ttft.append(None if m.first_token_time is None else m.first_token_time - m.arrival_time)
            done = m.finished_time is not None and m.first_token_time is not None
            decode.append(m.finished_time - m.first_token_time if done else None)
        return RunResult(wall, counts, sum(counts), ttft, decode, [o.num_cached_tokens for o in outputs])

    def warmup(self) -> float:
        return _warmup(self)

    def close(self) -> None:
        self.llm = None


def spec_decode_summary(stats) -> dict:
    """Speculative decoding over the engine's life (warm-up included): verifying steps, drafts proposed and
    accepted, the acceptance rate and the mean acceptance length (tokens per verifying step)."""
    steps, drafts, accepted = (
        stats.spec_decode_num_drafts,
        stats.spec_decode_num_draft_tokens,
        stats.spec_decode_num_accepted_tokens,
    )
    return {
        "num_drafts": steps,
        "num_draft_tokens": drafts,
        "num_accepted_tokens": accepted,
        "acceptance_rate": round(accepted / drafts, 4) if drafts else None,
        "mean_acceptance_length": round(1 + accepted / steps, 3) if steps else None,
    }


class HFBackend:
    """transformers ``generate`` in static batches of ``batch_size``, left-padded; random weights for a
    config-only folder (or ``load_format="dummy"``)."""

    name = "hf"

    def __init__(
        self,
        model: str,
        dtype: str = "auto",
        device: str = "auto",
        load_format: str = "auto",
        seed: int = 0,
        max_model_len: int | None = None,
        batch_size: int = DEFAULT_HF_BATCH_SIZE,
        brisk_only_flags: tuple[str, ...] = (),
    ):
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM

        from brisk.config import resolve_device, resolve_dtype

        start = time.perf_counter()
        self.device = resolve_device(device)
        folder = Path(model)
        if not (folder / "config.json").is_file():
            raise ValueError(f"--backend hf needs an HF-style model folder with config.json, got {model!r}.")
        config = AutoConfig.from_pretrained(folder)
        self.dtype = resolve_dtype(dtype, config, self.device)
        has_weights = any(folder.glob("*.safetensors")) or any(folder.glob("*.bin"))
        self.random_weights = load_format == "dummy" or not has_weights
        torch.manual_seed(seed)
        if self.random_weights:
            with self.device:  # initialize on the device: an 8B model in bf16 initializes in seconds there
                model_obj = AutoModelForCausalLM.from_config(config, dtype=self.dtype)
        else:
            model_obj = AutoModelForCausalLM.from_pretrained(folder, dtype=self.dtype)
        self.model = model_obj.to(self.device).eval()
        # Exact output lengths (ignore_eos): no EOS in the generation config means no row ever finishes early.
        # (min_new_tokens would do it too, but adds a logits processor to every step.)
        self.model.generation_config.eos_token_id = None
        self.vocab_size = int(config.vocab_size)
        max_positions = int(getattr(config, "max_position_embeddings", 2048))
        if max_model_len is not None and max_model_len > max_positions:
            raise ValueError(f"--max-model-len {max_model_len} exceeds the model's {max_positions} positions.")
        self.max_model_len = max_positions if max_model_len is None else max_model_len
        self.batch_size = batch_size
        self.brisk_only_flags = list(brisk_only_flags)  # given for brisk's engine (--backend both); HF has none
        self._sync()
        self.init_s = time.perf_counter() - start

    def describe(self) -> dict:
        import transformers

        return {
            "engine_init_s": round(self.init_s, 3),
            "device": str(self.device),
            "dtype": str(self.dtype).removeprefix("torch."),
            "transformers": transformers.__version__,
            "hf_batch_size": self.batch_size,
            "random_weights": self.random_weights,
            "attn_implementation": getattr(self.model.config, "_attn_implementation", None),
            "brisk_only_flags_not_applied": self.brisk_only_flags,
        }

    def _sync(self) -> None:
        import torch

        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _generate_batch(self, prompts: list[list[int]], max_new: int, temperature: float):
        """One left-padded batch; returns its new tokens (a rows x new tensor)."""
        import torch

        width = max(len(p) for p in prompts)
        ids = torch.zeros((len(prompts), width), dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, p in enumerate(prompts):
            ids[row, width - len(p) :] = torch.tensor(p)
            mask[row, width - len(p) :] = 1
        kwargs = dict(max_new_tokens=max_new, pad_token_id=0)
        if temperature > 0:
            kwargs.update(do_sample=True, temperature=temperature, top_k=0, top_p=1.0)
        else:
            kwargs.update(do_sample=False, temperature=None, top_k=None, top_p=None)
        with torch.inference_mode():
            out = self.model.generate(input_ids=ids.to(self.device), attention_mask=mask.to(self.device), **kwargs)
        return out[:, width:]

    def run(self, prompts: list[list[int]], output_lens: list[int], temperature: float) -> RunResult:
        """Static batches in request order; a batch decodes ``max(output_lens)`` of its requests (every row the
        same number of steps), and each request is credited only the tokens it asked for."""
        self._sync()
        start = time.perf_counter()
        generated = 0
        for first in range(0, len(prompts), self.batch_size):
            batch = prompts[first : first + self.batch_size]
            lens = output_lens[first : first + self.batch_size]
            new = self._generate_batch(batch, max(lens), temperature).shape[1]
            if new != max(lens):
                raise RuntimeError(f"HF generate made {new} tokens per row, expected {max(lens)}.")
            generated += new * len(batch)
        self._sync()
        wall = time.perf_counter() - start
        return RunResult(wall, list(output_lens), generated)

    def warmup(self) -> float:
        return _warmup(self)

    def close(self) -> None:
        self.model = None


class VLLMBackend:
    """vLLM's offline ``LLM`` on the same token ids, in the same engine process layout vLLM chooses itself; the
    engine flags vLLM shares with brisk (:data:`VLLM_ENGINE_FLAGS`) carry over under the same names."""

    name = "vllm"

    def __init__(self, model: str, engine_kwargs: dict, brisk_only_flags: tuple[str, ...] = ()):
        try:
            import vllm
        except ImportError as exc:
            raise RuntimeError(
                f"--backend vllm needs vLLM installed in this Python environment (pip install vllm): {exc}"
            ) from None
        from transformers import AutoConfig

        start = time.perf_counter()
        folder = Path(model)
        has_tokenizer = (folder / "tokenizer.json").is_file() or (folder / "tokenizer_config.json").is_file()
        kwargs = {k: engine_kwargs[k] for k in VLLM_ENGINE_FLAGS if k in engine_kwargs}
        if "tokenizer" not in kwargs and not has_tokenizer:
            kwargs["skip_tokenizer_init"] = True  # config-only shapes: the workloads send token ids
        self.llm = vllm.LLM(model=model, **kwargs)
        self.version = vllm.__version__
        config = AutoConfig.from_pretrained(folder) if folder.is_dir() else None
        self.vocab_size = int(config.vocab_size) if config is not None else 0
        self.max_model_len = int(self.llm.llm_engine.model_config.max_model_len)
        self.engine_args = kwargs
        self.brisk_only_flags = list(brisk_only_flags)
        self.init_s = time.perf_counter() - start

    def describe(self) -> dict:
        return {
            "engine_init_s": round(self.init_s, 3),
            "vllm": self.version,
            "engine_args": self.engine_args,
            "max_model_len": self.max_model_len,
            "brisk_only_flags_not_applied": self.brisk_only_flags,
        }

    def run(self, prompts: list[list[int]], output_lens: list[int], temperature: float) -> RunResult:
        from vllm import SamplingParams

        params = [
            SamplingParams(temperature=temperature, max_tokens=n, ignore_eos=True, detokenize=False)
            for n in output_lens
        ]
        start = time.perf_counter()
        outputs = self.llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        wall = time.perf_counter() - start
        counts = [len(o.outputs[0].token_ids) for o in outputs]
        return RunResult(wall, counts, sum(counts))

    def warmup(self) -> float:
        return _warmup(self)

    def close(self) -> None:
        self.llm = None


def _warmup(backend) -> float:
    """The recipe's warm-up: 4 prompts of 16, 64, 200 and 700 ids, 32 tokens, sampled then greedy (under a short
    max_model_len, prompts and outputs are cut to fit in it)."""
    output_len = max(1, min(WARMUP_OUTPUT_LEN, backend.max_model_len // 2))
    limit = max(1, backend.max_model_len - output_len)
    prompts = [p[:limit] for p in warmup_prompts()]
    lens = [output_len] * len(prompts)
    start = time.perf_counter()
    backend.run(prompts, lens, 0.6)
    backend.run(prompts, lens, 0.0)
    return time.perf_counter() - start


# The engine flags each peer applies; the others configure brisk's engine alone.
HF_ENGINE_FLAGS = ("dtype", "device", "load_format", "seed", "max_model_len")
# vLLM takes every engine flag under the same name but these two (it picks its device and attention itself).
VLLM_ENGINE_FLAGS = tuple(name for name in ENGINE_FLAGS if name not in ("device", "attention_backend"))
PEER_ENGINE_FLAGS = {"brisk": None, "hf": HF_ENGINE_FLAGS, "vllm": VLLM_ENGINE_FLAGS}  # None: every flag


def make_backend(name: str, model: str, engine_kwargs: dict, hf_batch_size: int, not_applied=()):
    """The backend ``name`` on ``model``; ``not_applied`` are the given flags it has no counterpart for."""
    if name == "brisk":
        return BriskBackend(model, engine_kwargs)
    if name == "hf":
        kwargs = {k: engine_kwargs[k] for k in HF_ENGINE_FLAGS if k in engine_kwargs}
        return HFBackend(model, **kwargs, batch_size=hf_batch_size, brisk_only_flags=tuple(not_applied))
    if name == "vllm":
        return VLLMBackend(model, engine_kwargs, tuple(not_applied))
    raise ValueError(f"Unknown backend {name!r}; choose brisk, hf or vllm.")
