"""Llama-family decoder (Llama 2/3/3.1/3.2, Mistral, SmolLM); Qwen2 and Qwen3 reuse it with their options."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import nn

from brisk.distributed.parallel_state import (
    is_first_stage,
    is_last_stage,
    recv_from_prev_stage,
    send_to_next_stage,
    stage_layers,
)
from brisk.layers.activation import SiluAndMul
from brisk.layers.attention.layer import Attention
from brisk.layers.embedding import LMHead, VocabEmbedding
from brisk.layers.fused_linear import rms_norm_gated_mlp, rms_norm_linear
from brisk.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear, check_loaded_shape
from brisk.layers.norm import RMSNorm
from brisk.layers.quantization.fp8_utils import FP8_DTYPES
from brisk.layers.rotary import RotaryEmbedding, rope_parameters


@dataclass(frozen=True)
class LayerOptions:
    """What a model family's decoder layers have, as HF transformers builds that family from its config."""

    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    qk_norm: bool


class LlamaAttention(nn.Module):
    def __init__(
        self, config, dtype: torch.dtype, max_position: int, backend: str, options: LayerOptions, quant, prefix: str
    ):
        super().__init__()
        self.head_size = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        num_kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        self.qkv_proj = QKVParallelLinear(
            config.hidden_size,
            self.head_size,
            config.num_attention_heads,
            num_kv_heads,
            options.qkv_bias,
            dtype,
            quant,
            f"{prefix}.qkv_proj",
        )
        self.num_heads = self.qkv_proj.num_heads
        self.num_kv_heads = self.qkv_proj.num_kv_heads
        self.o_proj = RowParallelLinear(
            config.num_attention_heads * self.head_size,
            config.hidden_size,
            options.o_bias,
            dtype,
            quant,
            f"{prefix}.o_proj",
        )
        self.q_norm = RMSNorm(self.head_size, config.rms_norm_eps, dtype) if options.qk_norm else None
        self.k_norm = RMSNorm(self.head_size, config.rms_norm_eps, dtype) if options.qk_norm else None
        self.rotary_emb = RotaryEmbedding(self.head_size, max_position, rope_parameters(config))
        self.attn = Attention(self.num_heads, self.num_kv_heads, self.head_size, self.head_size**-0.5, backend)

    def forward(self, positions: torch.Tensor, qkv: torch.Tensor) -> torch.Tensor:
        """Attention from the output of ``qkv_proj``, which the decoder layer fuses with the norm before it."""
        q_size, kv_size = self.num_heads * self.head_size, self.num_kv_heads * self.head_size
        q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)
        q = q.view(-1, self.num_heads, self.head_size)
        k = k.view(-1, self.num_kv_heads, self.head_size)
        v = v.view(-1, self.num_kv_heads, self.head_size)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        return self.o_proj(self.attn(q, k, v, self.rotary_emb, positions))


class LlamaMLP(nn.Module):
    def __init__(self, config, dtype: torch.dtype, bias: bool, quant, prefix: str):
        super().__init__()
        hidden, intermediate = config.hidden_size, config.intermediate_size
        self.gate_up_proj = MergedColumnParallelLinear(
            hidden, [intermediate] * 2, bias, dtype, quant, f"{prefix}.gate_up_proj"
        )
        self.down_proj = RowParallelLinear(intermediate, hidden, bias, dtype, quant, f"{prefix}.down_proj")
        if getattr(config, "hidden_act", "silu") not in ("silu", "swish"):  # transformers' swish is SiLU
            raise ValueError(f"hidden_act={config.hidden_act!r} is not supported (only silu).")
        self.act_fn = SiluAndMul()

    def forward(
        self, norm: RMSNorm, hidden_states: torch.Tensor, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The MLP with the (residual add +) ``norm`` before it, which its gate/up projection fuses; returns its
        output and the residual stream."""
        return rms_norm_gated_mlp(norm, self.gate_up_proj, self.act_fn, self.down_proj, hidden_states, residual)


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config, dtype, max_position, backend, options: LayerOptions, quant, prefix: str):
        super().__init__()
        self.self_attn = LlamaAttention(config, dtype, max_position, backend, options, quant, f"{prefix}.self_attn")
        self.mlp = LlamaMLP(config, dtype, options.mlp_bias, quant, f"{prefix}.mlp")
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)

    def forward(self, positions, hidden_states, residual):
        """Returns this layer's output and the residual stream before it is added (the next norm adds it)."""
        attn = self.self_attn
        qkv, residual = rms_norm_linear(self.input_layernorm, attn.qkv_proj, hidden_states, residual)
        hidden_states = attn(positions, qkv)
        return self.mlp(self.post_attention_layernorm, hidden_states, residual)


class MissingLayer(nn.Module):
    """A decoder layer another pipeline stage owns: it keeps the layer indices (and checkpoint names) in place."""


class LlamaModel(nn.Module):
    """With pipeline parallelism a stage builds only its own layers (``stage_layers``), the first stage the
    embedding and the last the final norm; the others receive their input from the stage before them and send
    their output (hidden states and the residual stream) to the stage after."""

    def __init__(self, config, dtype, max_position, backend, options: LayerOptions, quant):
        super().__init__()
        self.hidden_size, self.dtype = config.hidden_size, dtype
        self.layer_range = stage_layers(config.num_hidden_layers)
        self.embed_tokens = VocabEmbedding(config.vocab_size, config.hidden_size, dtype) if is_first_stage() else None
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(config, dtype, max_position, backend, options, quant, f"model.layers.{i}")
            if i in self.layer_range
            else MissingLayer()
            for i in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype) if is_last_stage() else None

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        if self.embed_tokens is not None:
            hidden_states, residual = self.embed_tokens(input_ids), None
        else:
            shape = (input_ids.shape[0], self.hidden_size)
            hidden_states, residual = recv_from_prev_stage(2, shape, self.dtype, input_ids.device)
        for i in self.layer_range:
            hidden_states, residual = self.layers[i](positions, hidden_states, residual)
        if self.norm is None:
            send_to_next_stage([hidden_states, residual])
            return hidden_states
        hidden_states, _ = self.norm(hidden_states, residual)
        return hidden_states


class LlamaForCausalLM(nn.Module):
    """Causal LM over the paged KV cache. ``forward`` returns final hidden states; ``compute_logits`` the
    vocabulary logits of the rows the sampler needs (so prompt positions never pay for the LM head)."""

    # Which config fields this family's HF modeling code reads (the Llama family and Mistral share this class
    # in HF's field names, not in what they honour): biases, q/k norms, the attention window.
    qkv_bias = False  # q/k/v biases whatever the config says (Qwen2)
    config_attention_bias = True  # config.attention_bias puts biases on q/k/v and o (Llama, Qwen3)
    config_mlp_bias = True  # config.mlp_bias puts biases on the MLP (Llama)
    qk_norm = False
    # checkpoint name fragment -> (fused parameter fragment, shard id)
    packed_modules_mapping = {
        "q_proj": ("qkv_proj", "q"),
        "k_proj": ("qkv_proj", "k"),
        "v_proj": ("qkv_proj", "v"),
        "gate_proj": ("gate_up_proj", 0),
        "up_proj": ("gate_up_proj", 1),
    }

    def __init__(self, config, dtype: torch.dtype, max_position: int, attention_backend: str, quant_config=None):
        """``quant_config``: a ``brisk.layers.quantization`` config that gives each linear layer its quant method
        (None: plain weights)."""
        super().__init__()
        window = self.sliding_window(config)
        if window and window < max_position:
            raise ValueError(
                f"This model uses sliding-window attention (window {window}), which brisk does not support yet; "
                f"pass max_model_len <= {window} to serve it with full attention, which is then identical."
            )
        self.config = config
        attention_bias = self.config_attention_bias and bool(getattr(config, "attention_bias", False))
        options = LayerOptions(
            qkv_bias=self.qkv_bias or attention_bias,
            o_bias=attention_bias,
            mlp_bias=self.config_mlp_bias and bool(getattr(config, "mlp_bias", False)),
            qk_norm=self.qk_norm,
        )
        self.model = LlamaModel(config, dtype, max_position, attention_backend, options, quant_config)
        self.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", False))
        self.lm_head = LMHead(config.vocab_size, config.hidden_size, dtype) if is_last_stage() else None
        if self.tie_word_embeddings and self.lm_head is not None and self.model.embed_tokens is not None:
            self.lm_head.weight = self.model.embed_tokens.weight

    @staticmethod
    def sliding_window(config) -> int | None:
        """The attention window HF applies to this family, or None. Llama and Mistral: ``sliding_window`` when
        set (HF's Llama forward ignores it, but its generate keeps only that many keys in the cache)."""
        return getattr(config, "sliding_window", None)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids, positions)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden_states)

    def attention_layers(self) -> list[Attention]:
        return [self.model.layers[i].self_attn.attn for i in self.model.layer_range]

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy checkpoint tensors (HF names) into parameters, routing q/k/v and gate/up into fused ones."""
        params = dict(self.named_parameters(remove_duplicate=False))
        loaded: set[str] = set()
        tied_head = None  # a tied model's lm_head.weight in the checkpoint: it must equal the embedding
        for name, tensor in weights:
            if "rotary_emb.inv_freq" in name:
                continue
            if name == "lm_head.weight" and self.tie_word_embeddings:
                tied_head = tensor
                continue
            name = self._stage_tensor_name(name)
            if name is None:  # another pipeline stage's
                continue
            # FP8 KV-cache scales; AutoFP8's kv_scale is both k_scale and v_scale.
            if name.endswith((".self_attn.k_scale", ".self_attn.v_scale", ".self_attn.kv_scale")):
                layer = self.model.layers[int(name.split(".")[2])]
                try:
                    for which in name.rpartition(".")[2].removesuffix("_scale"):
                        layer.self_attn.attn.load_kv_scale(which, tensor)
                except ValueError as exc:
                    raise ValueError(f"checkpoint tensor {name!r}: {exc}") from None
                continue
            checkpoint_name, shard_id = name, None
            for fragment, (fused, shard) in self.packed_modules_mapping.items():
                if f".{fragment}." in name:
                    name, shard_id = name.replace(fragment, fused), shard
                    break
            param = params.get(name)
            if param is None:
                raise ValueError(f"checkpoint tensor {name!r} has no matching parameter in {type(self).__name__}")
            try:
                if tensor.is_floating_point() != param.is_floating_point():
                    raise ValueError(
                        f"dtype {tensor.dtype}, expected {param.dtype} (a quantized checkpoint needs the "
                        "quantization_config its tool writes into config.json)"
                    )
                if param.dtype in FP8_DTYPES and tensor.dtype not in FP8_DTYPES:
                    raise ValueError(
                        f"dtype {tensor.dtype}, expected FP8 values ({param.dtype}) as config.json's "
                        "quantization_config says; a layer the checkpoint keeps unquantized must be named in its "
                        "modules_to_not_convert (ignored_layers); for a bf16/fp16/fp32 checkpoint remove "
                        "quantization_config and pass quantization='fp8' to quantize it while loading"
                    )
                loader = getattr(param, "weight_loader", None)
                if loader is None:
                    check_loaded_shape(tensor, param.shape)
                    param.data.copy_(tensor)
                else:
                    loader(param, tensor, shard_id)
            except ValueError as exc:
                raise ValueError(f"checkpoint tensor {checkpoint_name!r}: {exc}") from None
            loaded.add(name if shard_id is None else f"{name}:{shard_id}")
        missing = self._missing_tensors(params, loaded)
        if missing:
            raise ValueError(f"checkpoint is missing tensors: {missing[:8]}")
        embed_tokens = self.model.embed_tokens
        if tied_head is not None and embed_tokens is not None:
            self._check_tied_head(tied_head)

    def _check_tied_head(self, tied_head: torch.Tensor) -> None:
        embed_tokens = self.model.embed_tokens
        whole_shape = (embed_tokens.vocab_size, embed_tokens.weight.shape[1])
        if tuple(tied_head.shape) != whole_shape or not torch.equal(
            embed_tokens.shard(tied_head).to(embed_tokens.weight.device, embed_tokens.weight.dtype),
            embed_tokens.weight,
        ):
            raise ValueError(
                "config.json says tie_word_embeddings, but the checkpoint's lm_head.weight differs from "
                "model.embed_tokens.weight: set tie_word_embeddings to false in config.json to use both."
            )

    def _stage_tensor_name(self, name: str) -> str | None:
        """The parameter a checkpoint tensor loads into on this pipeline stage, or None when another stage owns it
        (a last stage that ties its LM head to the embedding loads the embedding into its head)."""
        index = name.split(".")[2] if name.startswith("model.layers.") else ""
        if index.isdigit() and int(index) < len(self.model.layers) and int(index) not in self.model.layer_range:
            return None
        if name == "model.embed_tokens.weight" and self.model.embed_tokens is None:
            return "lm_head.weight" if self.tie_word_embeddings and self.lm_head is not None else None
        if name == "lm_head.weight" and self.lm_head is None:
            return None
        if name == "model.norm.weight" and self.model.norm is None:
            return None
        return name

    def _missing_tensors(self, params: dict[str, torch.nn.Parameter], loaded: set[str]) -> list[str]:
        """Parameters not loaded, and fused ones with a part missing (named as the checkpoint names it)."""
        parts: dict[str, list[tuple[str, object]]] = {}
        for fragment, (fused, shard) in self.packed_modules_mapping.items():
            parts.setdefault(fused, []).append((fragment, shard))
        missing = []
        for name in params:
            if name == "lm_head.weight" and self.tie_word_embeddings:
                continue
            fused = next((f for f in parts if f".{f}." in name), None)
            if fused is None:
                if name not in loaded:
                    missing.append(name)
            else:
                missing += [
                    name.replace(fused, part) for part, shard in parts[fused] if f"{name}:{shard}" not in loaded
                ]
        return sorted(missing)
