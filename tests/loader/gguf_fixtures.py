"""Tiny GGUF files written with ``gguf.GGUFWriter``, the way llama.cpp's convert_hf_to_gguf.py writes them.

``write_tiny_gguf`` starts from a random transformers model (Llama or Qwen2, 2 layers, hidden 64), stores
it under llama.cpp tensor names (Q/K rows permuted for llama, as llama.cpp does), quantizes some tensors,
adds a small byte-level BPE vocabulary, and returns the float32 HF state dict that the converted folder
must reproduce: the original weights for F32 tensors, the dequantized weights for quantized ones.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import dequantize, quantize

Q = GGMLQuantizationType

CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# Merges in rank order; each result becomes a token after the 256 byte tokens.
MERGES = [
    ("Ġ", "t"),
    ("h", "e"),
    ("Ġt", "he"),
    ("i", "n"),
    ("Ġ", "a"),
    ("e", "r"),
    ("Ġ", "c"),
    ("a", "p"),
    ("Ġc", "ap"),
    ("Ġcap", "i"),
    ("t", "a"),
    ("Ġcapi", "ta"),
    ("Ġcapita", "l"),
    ("o", "f"),
    ("Ġ", "of"),
]
CONTROL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
USER_DEFINED = ["<tool_call>"]
N_PAD = 5  # unused [PAD] tokens at the end, as Qwen's GGUFs have

# Which GGML type each tensor kind is stored in, per variant. Q4_K needs rows of 256 values (the
# down projection, whose input is the 256-wide MLP); gguf.quants.quantize cannot produce Q4_K, so those
# tensors get random but valid Q4_K blocks (see _random_q4_k) and the reference uses their dequantized
# values. Everything else uses gguf.quants.quantize (Q8_0) or plain float arrays (F32/F16).
VARIANTS = {
    "f32": {},
    "mixed": {
        "token_embd": Q.Q8_0,
        "output": Q.Q8_0,
        "attn_q": Q.Q8_0,
        "attn_k": Q.F16,
        "attn_v": Q.Q8_0,
        "attn_output": Q.Q8_0,
        "ffn_gate": Q.Q8_0,
        "ffn_up": Q.F16,
        "ffn_down": Q.Q4_K,
    },
}


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table (byte-level BPE alphabet)."""
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), 256)]
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs, strict=True)}


@dataclass
class TinyVocab:
    tokens: list[str]
    types: list[int]
    merges: list[str]

    def id(self, text: str) -> int:
        return self.tokens.index(text)


def tiny_vocab() -> TinyVocab:
    tokens = list(CONTROL)
    types = [3] * len(CONTROL)
    alphabet = bytes_to_unicode()
    tokens += [alphabet[b] for b in range(256)]
    types += [1] * 256
    for a, b in MERGES:
        tokens.append(a + b)
        types.append(1)
    tokens += USER_DEFINED
    types += [4] * len(USER_DEFINED)
    tokens += [f"[PAD{len(tokens) + i}]" for i in range(N_PAD)]
    types += [5] * N_PAD
    return TinyVocab(tokens, types, [f"{a} {b}" for a, b in MERGES])


def tiny_hf_config(arch: str, vocab_size: int):
    from transformers import LlamaConfig, Qwen2Config

    common = dict(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rms_norm_eps=1e-5,
        bos_token_id=1,
        eos_token_id=2,
    )
    if arch == "llama":
        return LlamaConfig(**common, rope_theta=10000.0, tie_word_embeddings=True)
    if arch == "qwen2":
        return Qwen2Config(**common, rope_theta=1000000.0, tie_word_embeddings=False)
    raise ValueError(arch)


def _hf_to_gguf_name(name: str) -> str:
    table = {
        "model.embed_tokens.weight": "token_embd.weight",
        "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight",
    }
    if name in table:
        return table[name]
    layer = {
        "input_layernorm": "attn_norm",
        "self_attn.q_proj": "attn_q",
        "self_attn.k_proj": "attn_k",
        "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output",
        "post_attention_layernorm": "ffn_norm",
        "mlp.gate_proj": "ffn_gate",
        "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down",
    }
    _, _, idx, rest = name.split(".", 3)
    module, kind = rest.rsplit(".", 1)
    return f"blk.{idx}.{layer[module]}.{kind}"


def llama_cpp_permute(w: np.ndarray, n_head: int, n_head_kv: int | None = None) -> np.ndarray:
    """Verbatim logic of ``LlamaModel.permute`` in llama.cpp's convert_hf_to_gguf.py."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _random_q4_k(rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """Valid Q4_K blocks (d, dmin as small float16, random 6-bit scales/mins and 4-bit values)."""
    assert cols % 256 == 0
    n_blocks = rows * cols // 256
    blocks = np.empty((n_blocks, 144), dtype=np.uint8)
    blocks[:, 0:2] = rng.uniform(0.001, 0.004, n_blocks).astype(np.float16).view(np.uint8).reshape(-1, 2)
    blocks[:, 2:4] = rng.uniform(0.001, 0.004, n_blocks).astype(np.float16).view(np.uint8).reshape(-1, 2)
    blocks[:, 4:] = rng.integers(0, 256, (n_blocks, 140), dtype=np.uint8)
    return blocks.reshape(rows, cols // 256 * 144)


def write_tiny_gguf(
    path: Path,
    arch: str = "llama",
    variant: str = "f32",
    seed: int = 0,
    pre: str | None = None,
    arch_name: str | None = None,
    add_bos: bool | None = False,
    metadata: Callable[[GGUFWriter, str], None] | None = None,
) -> dict[str, torch.Tensor]:
    """Write a tiny GGUF to ``path``; return the float32 HF state dict it encodes (no lm_head when tied).
    ``add_bos`` None leaves ``tokenizer.ggml.add_bos_token`` out; ``metadata(writer, arch)`` adds keys."""
    from transformers import AutoModelForCausalLM

    vocab = tiny_vocab()
    config = tiny_hf_config(arch, len(vocab.tokens))
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    rng = np.random.default_rng(seed)
    policy = VARIANTS[variant]
    n_head, n_kv = config.num_attention_heads, config.num_key_value_heads

    w = GGUFWriter(str(path), arch_name or arch)
    w.add_block_count(config.num_hidden_layers)
    w.add_context_length(config.max_position_embeddings)
    w.add_embedding_length(config.hidden_size)
    w.add_feed_forward_length(config.intermediate_size)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_rope_freq_base(float(config.rope_parameters["rope_theta"]))
    w.add_layer_norm_rms_eps(config.rms_norm_eps)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre or ("smollm" if arch == "llama" else "qwen2"))
    w.add_token_list(vocab.tokens)
    w.add_token_types(vocab.types)
    w.add_token_merges(vocab.merges)
    w.add_bos_token_id(vocab.id("<|im_start|>"))
    w.add_eos_token_id(vocab.id("<|im_end|>"))
    w.add_pad_token_id(vocab.id("<|endoftext|>"))
    if add_bos is not None:
        w.add_add_bos_token(add_bos)
    w.add_chat_template(CHATML)
    if metadata is not None:
        metadata(w, arch_name or arch)

    reference: dict[str, torch.Tensor] = {}
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        gname = _hf_to_gguf_name(name)
        data = tensor.detach().numpy().astype(np.float32)
        kind = gname.split(".")[-2] if gname.startswith("blk.") else gname.split(".")[0]
        qtype = policy.get(kind, Q.F32) if name.endswith(".weight") and data.ndim == 2 else Q.F32
        if qtype == Q.Q4_K:
            raw = _random_q4_k(*data.shape, rng)
            data = dequantize(raw, qtype)  # the weight this file really holds
        elif qtype == Q.Q8_0:
            raw = quantize(data, qtype)
            data = dequantize(raw, qtype)
        elif qtype == Q.F16:
            raw = data.astype(np.float16)
            data = raw.astype(np.float32)
        else:
            raw = data
        reference[name] = torch.from_numpy(np.ascontiguousarray(data))
        if arch == "llama" and kind in ("attn_q", "attn_k"):
            # Quantization works on rows of the permuted matrix; permuting whole rows commutes with it.
            heads = n_head if kind == "attn_q" else n_kv
            raw = llama_cpp_permute(raw, n_head, None if kind == "attn_q" else heads)
        if qtype in (Q.Q8_0, Q.Q4_K):
            w.add_tensor(gname, np.ascontiguousarray(raw), raw_shape=raw.shape, raw_dtype=qtype)
        else:
            w.add_tensor(gname, np.ascontiguousarray(raw))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return reference


def hf_model_from_state_dict(arch: str, state: dict[str, torch.Tensor]):
    """A float32 transformers model holding exactly ``state`` (the expected result of a conversion)."""
    from transformers import AutoModelForCausalLM

    config = tiny_hf_config(arch, state["model.embed_tokens.weight"].shape[0])
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    if config.tie_word_embeddings:
        model.tie_weights()
    return model.eval()
