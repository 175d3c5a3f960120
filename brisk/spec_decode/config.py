"""``speculative_config``: vLLM's field names, validated into a ``SpeculativeConfig``."""

from __future__ import annotations

from dataclasses import dataclass

METHODS = ("ngram", "draft_model")
_FIELDS = (
    "method",
    "model",
    "num_speculative_tokens",
    "prompt_lookup_min",
    "prompt_lookup_max",
    "disable_by_batch_size",
    "quantization",
)

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
    such field). With ``disable_by_batch_size`` running requests or more nothing is
    proposed: a large batch already keeps the device busy, and verifying drafts would only add work. It defaults
    to :data:`DEFAULT_DISABLE_BY_BATCH_SIZE`; None proposes at every batch size (vLLM's default)."""

    method: str
    num_speculative_tokens: int
    model: str | None = None
    prompt_lookup_min: int = 2
    prompt_lookup_max: int = 5
    disable_by_batch_size: int | None = DEFAULT_DISABLE_BY_BATCH_SIZE
    quantization: str | None = None

    @classmethod
    def from_dict(cls, config: dict) -> SpeculativeConfig:
        """Validate a user's dict (``LLM(speculative_config=...)`` or ``--speculative-config`` JSON)."""
        if not isinstance(config, dict):
            raise ValueError(f"speculative_config must be a dict (a JSON object), got {config!r}.")
        unknown = sorted(set(config) - set(_FIELDS))
        if unknown:
            raise ValueError(f"speculative_config has unknown fields {unknown}; accepted: {list(_FIELDS)}.")
        method = config.get("method")
        if method not in METHODS:
            raise ValueError(f"speculative_config['method'] must be one of {list(METHODS)}, got {method!r}.")
        model = config.get("model")
        if method == "draft_model" and not (isinstance(model, str) and model):
            raise ValueError("speculative_config: method 'draft_model' needs 'model' (a name, folder or GGUF file).")
        for field in ("model", "quantization"):
            if method == "ngram" and config.get(field) is not None:
                raise ValueError(f"speculative_config: method 'ngram' takes no '{field}' (it is for 'draft_model').")
        quantization = config.get("quantization")
        if quantization is not None and not isinstance(quantization, str):
            raise ValueError(f"speculative_config['quantization'] must be a format's name, not {quantization!r}.")
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
        return cls(method, k, model, low, high, disable, quantization)

    def is_active(self, batch_size: int) -> bool:
        """Whether to propose drafts for a batch of ``batch_size`` running requests (the load-aware rule)."""
        return self.disable_by_batch_size is None or batch_size < self.disable_by_batch_size


def _require_int(value: object, name: str, minimum: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"speculative_config['{name}'] must be an integer >= {minimum}, got {value!r}.")
