"""Engine arguments and the resolved configuration derived from them (model, cache, scheduler)."""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from brisk.json_config import json_config, reads_without_transformers
from brisk.layers.quantization import QUANTIZATION_METHODS
from brisk.layers.quantization.kv_cache import KV_CACHE_DTYPES
from brisk.spec_decode.config import SpeculativeConfig

_DTYPES = {
    "float32": torch.float32,
    "float": torch.float32,
    "float16": torch.float16,
    "half": torch.float16,
    "bfloat16": torch.bfloat16,
}
LOAD_FORMATS = ("auto", "safetensors", "dummy")
# uni: the engine's process is the only rank; mp: one worker process per rank; ray: one Ray actor per rank
EXECUTOR_BACKENDS = ("uni", "mp", "ray")
DEFAULT_CPU_KV_CACHE_BYTES = 2 << 30
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9


def default_max_num_batched_tokens(device: torch.device, serving: bool) -> int:
    """The step budget when none is given. On a GPU, 16,384 tokens offline, where throughput is all; 8,192 when
    serving, since a step that prefills 16,384 tokens beside the running decodes (an 8B model: about 0.4 s on an
    H200) is a pause in every stream (vLLM takes the same two budgets). 2,048 on the CPU."""
    if device.type != "cuda":
        return 2048
    return 8192 if serving else 16384


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity, which containers and taskset narrow)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


@dataclass
class EngineArgs:
    """Everything a user can set when building an engine (``LLM(...)`` and ``brisk serve`` flags)."""

    model: str
    tokenizer: str | None = None
    revision: str | None = None  # hub ids: a branch, tag or commit (default: main)
    download_dir: str | None = None  # hub ids: download here instead of the Hugging Face cache
    # Let transformers run the model folder's own Python for its config and tokenizer classes (``auto_map``); the
    # model itself is always brisk's implementation of its ``architectures``.
    trust_remote_code: bool = False
    # Sampling defaults of requests that leave them out: "auto" the model's generation_config.json (as vLLM),
    # "vllm" the neutral ones, or a folder holding a generation_config.json (engine/generation_defaults.py).
    generation_config: str = "auto"
    dtype: str = "auto"
    device: str = "auto"
    max_model_len: int | None = None
    block_size: int = 16
    enable_prefix_caching: bool = True
    max_num_batched_tokens: int | None = None  # None: default_max_num_batched_tokens
    max_num_seqs: int = 256
    gpu_memory_utilization: float | None = None  # None: 0.9 on a GPU; an error on the CPU (it has no meaning there)
    kv_cache_memory_bytes: int | None = None
    seed: int = 0
    load_format: str = "auto"
    enforce_eager: bool = False
    attention_backend: str | None = None
    async_scheduling: bool | None = None  # None: on for CUDA (the host prepares step N+1 during N), off on CPU
    speculative_config: dict | None = None  # vLLM's fields, e.g. {"method": "ngram", "num_speculative_tokens": 4}
    quantization: str | None = None  # None: the checkpoint's quantization_config, if any; "fp8": quantize on load
    kv_cache_dtype: str = "auto"
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    distributed_executor_backend: str | None = None  # None: "uni" for one rank, "mp" for more
    cpu_threads: int | None = None  # CPU: torch threads of the whole engine, split over its ranks (None: one a core)
    # Several machines, torchrun's names: node 0 runs the engine and its share of the ranks, the others only ranks.
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int | None = None  # None: a free port on one node; 29500 (torchrun's) on several
    serving: bool = False  # set by `brisk serve`: defaults that favour inter-token latency over throughput

    @property
    def world_size(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size

    def validate(self) -> None:
        def require(ok: bool, message: str) -> None:
            if not ok:
                raise ValueError(message)

        self._validate_types()
        require(isinstance(self.model, (str, Path)) and str(self.model) != "", "model must be a non-empty string.")
        require(
            self.dtype in ("auto", *_DTYPES),
            f"dtype must be 'auto' or one of {sorted(_DTYPES)}, got {self.dtype!r}.",
        )
        require(
            self.load_format in LOAD_FORMATS,
            f"load_format must be one of {LOAD_FORMATS}, got {self.load_format!r}.",
        )
        require(
            self.block_size in (8, 16, 32, 64, 128),
            f"block_size must be one of 8, 16, 32, 64, 128, got {self.block_size!r}.",
        )
        require(self.max_num_seqs >= 1, f"max_num_seqs must be >= 1, got {self.max_num_seqs}.")
        require(self.cpu_threads is None or self.cpu_threads >= 1, f"cpu_threads must be >= 1, got {self.cpu_threads}.")
        require(
            self.max_num_batched_tokens is None or self.max_num_batched_tokens >= 1,
            f"max_num_batched_tokens must be >= 1, got {self.max_num_batched_tokens}.",
        )
        require(
            self.gpu_memory_utilization is None or 0 < self.gpu_memory_utilization <= 1,
            f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}.",
        )
        require(
            self.gpu_memory_utilization is None or self.kv_cache_memory_bytes is None,
            "gpu_memory_utilization and kv_cache_memory_bytes both size the KV cache: give one of them.",
        )
        require(
            self.kv_cache_dtype in KV_CACHE_DTYPES,
            f"kv_cache_dtype must be one of {tuple(KV_CACHE_DTYPES)}, got {self.kv_cache_dtype!r}.",
        )
        require(
            self.quantization is None or self.quantization in QUANTIZATION_METHODS,
            f"quantization must be one of {sorted(QUANTIZATION_METHODS)} (or unset), got {self.quantization!r}.",
        )
        require(0 <= self.seed < 2**63, f"seed must be in [0, 2**63), got {self.seed}.")
        require(
            self.kv_cache_memory_bytes is None or self.kv_cache_memory_bytes > 0,
            f"kv_cache_memory_bytes must be positive, got {self.kv_cache_memory_bytes}.",
        )
        require(
            self.max_model_len is None or self.max_model_len >= 1,
            f"max_model_len must be >= 1, got {self.max_model_len}.",
        )
        require(self.tensor_parallel_size >= 1, f"tensor_parallel_size must be >= 1, got {self.tensor_parallel_size}.")
        require(
            self.pipeline_parallel_size >= 1,
            f"pipeline_parallel_size must be >= 1, got {self.pipeline_parallel_size}.",
        )
        require(
            self.distributed_executor_backend in (None, *EXECUTOR_BACKENDS),
            f"distributed_executor_backend must be one of {EXECUTOR_BACKENDS}, got "
            f"{self.distributed_executor_backend!r}.",
        )
        require(
            self.pipeline_parallel_size == 1 or not self.async_scheduling,
            "async_scheduling needs each step's sampled tokens on the first pipeline stage; with "
            "pipeline_parallel_size > 1 leave it off.",
        )
        require(self.nnodes >= 1, f"nnodes must be >= 1, got {self.nnodes}.")
        require(
            self.nnodes == 1 or self.distributed_executor_backend != "ray",
            "distributed_executor_backend='ray' places the ranks on the Ray cluster's nodes itself: leave nnodes "
            "at 1 (and start only node 0's command).",
        )
        require(
            0 <= self.node_rank < self.nnodes, f"node_rank must be in [0, nnodes={self.nnodes}), got {self.node_rank}."
        )
        require(
            self.world_size % self.nnodes == 0,
            f"tensor_parallel_size x pipeline_parallel_size = {self.world_size} ranks do not split evenly over "
            f"nnodes={self.nnodes}.",
        )
        require(
            self.master_port is None or 0 < self.master_port < 65535,
            f"master_port must be in [1, 65534] (the next port carries the engine's commands), got {self.master_port}.",
        )
        require(
            self.distributed_executor_backend != "uni" or self.world_size == 1,
            f"distributed_executor_backend='uni' runs one rank in the engine's process; tensor_parallel_size x "
            f"pipeline_parallel_size = {self.world_size} ranks need 'mp'.",
        )
        speculative = self.parsed_speculative_config()
        require(
            speculative is None
            or speculative.method == "ngram"
            or (self.world_size == 1 and self.distributed_executor_backend in (None, "uni")),
            "speculative_config method 'draft_model' is not supported with worker processes yet (they run no draft "
            "model): use tensor_parallel_size=1, pipeline_parallel_size=1 and the default executor ('uni'), or "
            "method 'ngram'.",
        )


    def parsed_speculative_config(self) -> SpeculativeConfig | None:
        """``speculative_config`` validated (a ValueError names the field to fix), or None without one."""
        return None if self.speculative_config is None else SpeculativeConfig.from_dict(self.speculative_config)

    def _validate_types(self) -> None:
        """Each field's type, so that a wrong one fails here, by name, rather than deep in engine start-up. A field
        whose default is None also takes None; bool is refused where a number is meant (Python counts it an int)."""
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "model" or (value is None and f.default is None):
                continue
            kinds, what = _FIELD_TYPES[f.name]
            if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
                raise ValueError(f"{f.name} must be {what}, got {value!r} ({type(value).__name__}).")


_FIELD_TYPES: dict[str, tuple[tuple[type, ...], str]] = {
    "tokenizer": ((str, Path), "a path or a name"),
    "revision": ((str,), "a string"),
    "download_dir": ((str, Path), "a path"),
    **{
        name: ((str,), "a string")
        for name in (
            "dtype",
            "device",
            "load_format",
            "attention_backend",
            "quantization",
            "kv_cache_dtype",
            "generation_config",
            "distributed_executor_backend",
            "master_addr",
        )
    },
    **{
        name: ((int,), "an integer")
        for name in (
            "cpu_threads",
            "max_model_len",
            "block_size",
            "max_num_batched_tokens",
            "max_num_seqs",
            "seed",
            "tensor_parallel_size",
            "pipeline_parallel_size",
            "nnodes",
            "node_rank",
            "master_port",
        )
    },
    "kv_cache_memory_bytes": ((int,), "an integer"),
    **{
        name: ((bool,), "True or False")
        for name in ("trust_remote_code", "enable_prefix_caching", "enforce_eager", "async_scheduling", "serving")
    },
    "gpu_memory_utilization": ((int, float), "a number"),
    "speculative_config": ((dict,), "a dict (a JSON object)"),
}


def resolve_device(device: str) -> torch.device:
    """``auto``, ``cpu``, ``cuda`` or ``cuda:N``: the devices brisk runs on."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except RuntimeError:
        dev = None
    if dev is None or dev.type not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {device!r}.")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda' was requested but no CUDA GPU is visible; use device='cpu' or 'auto'.")
    return dev


def preferred_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """The dtype to materialize weights in when a checkpoint has no opinion (GGUF, dummy)."""
    if dtype != "auto":
        return _DTYPES[dtype]
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def resolve_dtype(dtype: str, hf_config, device: torch.device) -> torch.dtype:
    """``auto``: float32 on CPU (exact and fast without AMX); the checkpoint's dtype on GPU, float32 -> bf16."""
    if dtype != "auto":
        return _DTYPES[dtype]
    if device.type != "cuda":
        return torch.float32
    config_dtype = getattr(hf_config, "dtype", None) or getattr(hf_config, "torch_dtype", None)
    if isinstance(config_dtype, str):
        config_dtype = _DTYPES.get(config_dtype)
    return config_dtype if config_dtype in (torch.float16, torch.bfloat16) else torch.bfloat16


def read_hf_config(folder: Path, trust_remote_code: bool = False):
    """The folder's config: read directly for the families brisk implements (``brisk.json_config``: importing
    transformers is most of start-up), else with transformers' ``AutoConfig``, which knows every other config's
    defaults; ``trust_remote_code`` lets it run a config class the folder ships (``auto_map``)."""
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise FileNotFoundError(f"{folder} has no config.json; is it an HF-style model folder?")
    try:
        fields = json.loads(config_path.read_text())
    except ValueError:
        fields = None
    if not isinstance(fields, dict):
        raise ValueError(f"{config_path} is not a JSON object; is the file complete?")
    if reads_without_transformers(fields, trust_remote_code):
        return json_config(fields)
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(folder, trust_remote_code=trust_remote_code)
    except (ValueError, KeyError, OSError) as exc:
        raise ValueError(f"Cannot read {config_path} (model_type={fields.get('model_type')!r}): {exc}") from exc


@dataclass
class ModelConfig:
    path: Path
    hf_config: object
    dtype: torch.dtype
    max_model_len: int
    num_layers: int
    num_kv_heads: int
    head_size: int
    quant_config: object | None = None  # a brisk.layers.quantization config: how linear layers hold weights
    kv_cache_dtype: torch.dtype | None = None  # None: the model's dtype
    trust_remote_code: bool = False  # a draft model's folder is read as the target's was

    @classmethod
    def from_hf_config(cls, path: Path, hf_config, dtype: torch.dtype, max_model_len: int | None) -> ModelConfig:
        text_config = getattr(hf_config, "text_config", None) or hf_config
        max_positions = getattr(text_config, "max_position_embeddings", None) or 2048
        if max_model_len is None:
            max_model_len = max_positions
        elif max_model_len > max_positions:
            raise ValueError(
                f"max_model_len={max_model_len} exceeds the model's max_position_embeddings={max_positions}; "
                f"pass max_model_len <= {max_positions}."
            )
        num_heads = text_config.num_attention_heads
        head_size = getattr(text_config, "head_dim", None) or text_config.hidden_size // num_heads
        return cls(
            path=path,
            hf_config=text_config,
            dtype=dtype,
            max_model_len=max_model_len,
            num_layers=text_config.num_hidden_layers,
            num_kv_heads=getattr(text_config, "num_key_value_heads", None) or num_heads,
            head_size=head_size,
        )

    @property
    def kv_dtype(self) -> torch.dtype:
        return self.kv_cache_dtype or self.dtype

    def kv_bytes_per_token(self, kv_dtype: torch.dtype) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_size * kv_dtype.itemsize
