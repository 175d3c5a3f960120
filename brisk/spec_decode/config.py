"""``speculative_config``: vLLM's field names, validated into a ``SpeculativeConfig``."""

from __future__ import annotations

from dataclasses import dataclass

METHODS = ("ngram", "draft_model")
DRAFT_SAMPLE_METHODS = ("greedy", "probabilistic")
_FIELDS = (
    "method",
    "model",
    "num_speculative_tokens",
    "prompt_lookup_min",
    "prompt_lookup_max",
    "disable_by_batch_size",
    "quantization",
    "revision",
    "max_model_len",
    "draft_sample_method",
)


def _any(value: object) -> bool:
    return True


# Fields of vLLM's SpeculativeConfig for what brisk does not do (other methods, other drafters' or backends'
# choices), accepted where their value asks for nothing, so that a config written for vLLM runs as it would there.
_NOTHING_ASKED = {
    "enforce_eager": lambda v: v is None,
    "draft_tensor_parallel_size": lambda v: v in (None, 1),
    "tensor_parallel_size": lambda v: v is None,
    "moe_backend": lambda v: v is None,
    "attention_backend": lambda v: v is None,
    "kv_cache_dtype": lambda v: v in (None, "auto"),
    "code_revision": lambda v: v is None,
    "draft_load_config": lambda v: v is None,
    "disable_padded_drafter_batch": _any,  # EAGLE's input padding
    "use_local_argmax_reduction": lambda v: v in (None, False),
    "use_heterogeneous_vocab": lambda v: v in (None, False),
    "parallel_drafting": lambda v: v in (None, False),
    "num_speculative_tokens_per_batch_size": lambda v: v is None,
    "rejection_sample_method": lambda v: v in (None, "standard"),
    "synthetic_acceptance_rates": lambda v: v is None,
    "synthetic_acceptance_length": lambda v: v is None,
    "suffix_decoding_max_tree_depth": _any,  # method "suffix"
    "suffix_decoding_max_cached_requests": _any,
    "suffix_decoding_max_spec_factor": _any,
    "suffix_decoding_min_token_prob": _any,
}

# Running requests from which nothing is proposed when the config leaves ``disable_by_batch_size`` out. On an
# H200 (benchmarks/results/HISTORY.md, thirteenth and fourteenth runs) speculation paid only at batch 1, and only
# where the output copies the prompt (n-gram on editing prompts: 1.04-1.09x); at batch 8 n-gram ran at 0.58x of plain
# decoding and a step verifying a draft model's 4 tokens cost 4.5x a plain step, more than its at most 5 tokens
# repay at the acceptance measured on real weights. An explicit ``None`` (JSON null) proposes at every size.
DEFAULT_DISABLE_BY_BATCH_SIZE = 2


@dataclass(frozen=True)
class SpeculativeConfig:
    """How many tokens to propose and how.

    ``ngram`` (prompt lookup) looks for the last ``prompt_lookup_max`` .. ``prompt_lookup_min`` tokens earlier in
    the sequence and proposes what followed them; ``draft_model`` runs ``model`` (anything ``LLM(model=...)``
    accepts, with the target's vocabulary), its weights quantized as ``quantization`` says (a format that quantizes
    while loading, e.g. ``"fp8"``: a cheaper draft, the same target tokens; a quantized draft checkpoint needs no
    such field). A draft model proposes its argmax for every request (``draft_sample_method`` ``"greedy"``, vLLM's
    default: the drafts are then a point mass, as n-gram's are) or, with ``"probabilistic"``, draws a sampled
    request's drafts from its own distribution under the request's settings, which the rejection sampler then
    reads. Either keeps the target's distribution. With ``disable_by_batch_size`` running requests or more nothing is
    proposed: a large batch already keeps the device busy, and verifying drafts would only add work. It defaults
    to :data:`DEFAULT_DISABLE_BY_BATCH_SIZE`; None proposes at every batch size (vLLM's default)."""

    method: str
    num_speculative_tokens: int
    model: str | None = None
    prompt_lookup_min: int = 2
    prompt_lookup_max: int = 5
    disable_by_batch_size: int | None = DEFAULT_DISABLE_BY_BATCH_SIZE
    quantization: str | None = None
    revision: str | None = None  # the draft's revision on the Hugging Face hub
    max_model_len: int | None = None  # the draft's context: at least the engine's max_model_len
    draft_sample_method: str = "greedy"

    @classmethod
    def from_dict(cls, config: dict) -> SpeculativeConfig:
        """Validate a user's dict (``LLM(speculative_config=...)`` or ``--speculative-config`` JSON)."""
        if not isinstance(config, dict):
            raise ValueError(f"speculative_config must be a dict (a JSON object), got {config!r}.")
        unknown = sorted(set(config) - set(_FIELDS) - set(_NOTHING_ASKED))
        if unknown:
            raise ValueError(f"speculative_config has unknown fields {unknown}; accepted: {list(_FIELDS)}.")
        for field, asks_nothing in _NOTHING_ASKED.items():
            if field in config and not asks_nothing(config[field]):
                raise ValueError(
                    f"speculative_config['{field}']={config[field]!r} asks for what brisk's speculative decoding does "
                    "not do; leave the field out."
                )
        method = config.get("method")
        if method not in METHODS:
            raise ValueError(f"speculative_config['method'] must be one of {list(METHODS)}, got {method!r}.")
        model = config.get("model")
        if method == "draft_model" and not (isinstance(model, str) and model):
            raise ValueError("speculative_config: method 'draft_model' needs 'model' (a name, folder or GGUF file).")
        for field in ("model", "quantization", "revision", "max_model_len", "draft_sample_method"):
            if method == "ngram" and config.get(field) is not None:
                raise ValueError(f"speculative_config: method 'ngram' takes no '{field}' (it is for 'draft_model').")
        for field in ("quantization", "revision"):
            if config.get(field) is not None and not isinstance(config[field], str):
                raise ValueError(f"speculative_config['{field}'] must be a string, not {config[field]!r}.")
        if config.get("max_model_len") is not None:
            _require_int(config["max_model_len"], "max_model_len", minimum=1)
        draft_sample_method = config.get("draft_sample_method") or "greedy"
        if draft_sample_method not in DRAFT_SAMPLE_METHODS:
            raise ValueError(
                f"speculative_config['draft_sample_method'] must be one of {list(DRAFT_SAMPLE_METHODS)}, "
                f"got {draft_sample_method!r}."
            )
        k = config.get("num_speculative_tokens")
        _require_int(k, "num_speculative_tokens", minimum=1)
        low, high = config.get("prompt_lookup_min"), config.get("prompt_lookup_max")
        if low is None and high is None:
            low, high = cls.prompt_lookup_min, cls.prompt_lookup_max
        low = high if low is None else low  # one of them given: a window of one size (vLLM's rule)
        high = low if high is None else high
        _require_int(low, "prompt_lookup_min", minimum=1)
        _require_int(high, "prompt_lookup_max", minimum=1)
        if low > high:
            raise ValueError(f"speculative_config: prompt_lookup_min={low} exceeds prompt_lookup_max={high}.")
        disable = config.get("disable_by_batch_size", DEFAULT_DISABLE_BY_BATCH_SIZE)
        if disable is not None:
            _require_int(disable, "disable_by_batch_size", minimum=1)
        return cls(method, k, model, low, high, disable, config.get("quantization"), config.get("revision"),
                   config.get("max_model_len"), draft_sample_method)  # fmt: skip

    def is_active(self, batch_size: int) -> bool:
        """Whether to propose drafts for a batch of ``batch_size`` running requests (the load-aware rule)."""
        return self.disable_by_batch_size is None or batch_size < self.disable_by_batch_size


def _require_int(value: object, name: str, minimum: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"speculative_config['{name}'] must be an integer >= {minimum}, got {value!r}.")
