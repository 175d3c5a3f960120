"""GGUF -> HF folder conversion on tiny GGUFs written by the test (llama and qwen2, F32 and quantized)."""

from __future__ import annotations

import json
import re

import gguf
import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from brisk.loader.gguf import GGUFFile, convert_gguf, permute_qk, unpermute_qk
from tests.loader.gguf_fixtures import (
    CHATML,
    hf_model_from_state_dict,
    llama_cpp_permute,
    tiny_vocab,
    write_tiny_gguf,
)

TEXTS = [
    "the capital of France is Paris",
    "Hello, world! 123 4567 -- it's   spaced\n\n\ttabs",
    "héllo wörld — 日本語のテキスト 🙂👍🏽 ünïcödé",
    "<|im_start|>user\nhi<|im_end|>\n",
]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(arch, variant) -> (gguf path, reference state dict, converted float32 folder); built lazily."""
    cache = {}

    def get(arch: str, variant: str):
        if (arch, variant) not in cache:
            d = tmp_path_factory.mktemp(f"{arch}-{variant}")
            ref = write_tiny_gguf(d / "model.gguf", arch, variant)
            out = d / "hf"
            out.mkdir()
            convert_gguf(d / "model.gguf", out, torch.float32)
            cache[arch, variant] = (d / "model.gguf", ref, out)
        return cache[arch, variant]

    return get


# ---- reader ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_reader_matches_gguf_reader(tiny, arch):
    path, _, _ = tiny(arch, "mixed")
    ours = GGUFFile(path)
    ref = gguf.GGUFReader(path)
    ref_fields = {k: f.contents() for k, f in ref.fields.items() if not k.startswith("GGUF.")}
    assert ours.fields.keys() == ref_fields.keys()
    for key, value in ref_fields.items():
        if isinstance(value, float):
            assert ours.fields[key] == pytest.approx(value), key
        else:
            assert ours.fields[key] == value, key
    assert list(ours.tensors) == [t.name for t in ref.tensors]
    for t in ref.tensors:
        info = ours.tensors[t.name]
        assert info.qtype == t.tensor_type
        assert info.shape == tuple(reversed(t.shape.tolist()))
        assert info.offset == t.data_offset and info.nbytes == t.n_bytes
        np.testing.assert_array_equal(ours.raw(t.name), np.asarray(t.data).view(np.uint8))
        np.testing.assert_array_equal(ours.dequantize(t.name), gguf.quants.dequantize(t.data, t.tensor_type))


def test_split_file_reads_like_whole(tiny, tmp_path):
    """A GGUF cut into byte slices (like the Qwen part packages), including a cut inside the header."""
    path, _, _ = tiny("qwen2", "mixed")
    blob = path.read_bytes()
    whole = GGUFFile(path)
    cuts = [0, 100, whole.data_offset + 1000, len(blob) // 2 + 7, len(blob)]
    parts = []
    for i, (a, b) in enumerate(zip(cuts, cuts[1:], strict=False)):
        p = tmp_path / f"part{i:02d}.bin"
        p.write_bytes(blob[a:b])
        parts.append(p)
    split = GGUFFile(parts)
    assert split.fields == whole.fields and split.tensors == whole.tensors
    for name in whole.tensors:
        np.testing.assert_array_equal(split.dequantize(name), whole.dequantize(name))


def test_truncated_gguf_is_a_clear_error(tiny, tmp_path):
    path, _, _ = tiny("llama", "f32")
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(path.read_bytes()[:-100])
    g = GGUFFile(cut)  # the header is intact
    with pytest.raises(ValueError, match="truncated"):
        for name in g.tensors:
            g.dequantize(name)
    cut.write_bytes(path.read_bytes()[:200])
    with pytest.raises(ValueError, match="truncated or corrupt"):
        GGUFFile(cut)


def test_unpermute_inverts_llama_cpp_permute():
    w = np.arange(8 * 16 * 3, dtype=np.float32).reshape(8 * 16, 3)
    for n_head in (1, 2, 4, 8):
        permuted = llama_cpp_permute(w, n_head)
        assert not np.array_equal(permuted, w)
        np.testing.assert_array_equal(permute_qk(w, n_head), permuted)
        np.testing.assert_array_equal(unpermute_qk(permuted, n_head), w)
    b = np.arange(32, dtype=np.float32)  # biases are permuted the same way
    np.testing.assert_array_equal(unpermute_qk(llama_cpp_permute(b, 2), 2), b)


# ---- weights -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("variant", ["f32", "mixed"])
def test_converted_weights_and_logits_match(tiny, arch, variant):
    """F32 tensors come out bit-exact; Q8_0 / F16 / Q4_K ones equal their dequantized values."""
    _, ref, out = tiny(arch, variant)
    sd = load_file(out / "model.safetensors")
    assert sd.keys() == ref.keys()
    for name, tensor in ref.items():
        assert sd[name].dtype == torch.float32
        assert torch.equal(sd[name], tensor), name
    converted = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    expected = hf_model_from_state_dict(arch, ref)
    ids = torch.randint(0, len(tiny_vocab().tokens), (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(converted(ids).logits, expected(ids).logits)


def test_llama_ties_lm_head_and_qwen2_does_not(tiny):
    _, _, llama = tiny("llama", "f32")
    _, _, qwen = tiny("qwen2", "f32")
    llama_cfg = json.loads((llama / "config.json").read_text())
    qwen_cfg = json.loads((qwen / "config.json").read_text())
    assert llama_cfg["tie_word_embeddings"] is True
    assert "lm_head.weight" not in load_file(llama / "model.safetensors")
    assert qwen_cfg["tie_word_embeddings"] is False
    assert "lm_head.weight" in load_file(qwen / "model.safetensors")
    assert "model.layers.0.self_attn.q_proj.bias" in load_file(qwen / "model.safetensors")


def test_config_fields(tiny):
    _, _, out = tiny("qwen2", "mixed")
    cfg = json.loads((out / "config.json").read_text())
    vocab = tiny_vocab()
    assert cfg["architectures"] == ["Qwen2ForCausalLM"] and cfg["model_type"] == "qwen2"
    assert (cfg["num_hidden_layers"], cfg["hidden_size"], cfg["intermediate_size"]) == (2, 64, 256)
    assert (cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]) == (4, 2, 16)
    assert cfg["rope_theta"] == 1000000.0 and cfg["rope_parameters"]["rope_theta"] == 1000000.0
    assert cfg["rms_norm_eps"] == pytest.approx(1e-5)
    assert cfg["max_position_embeddings"] == 256
    assert cfg["vocab_size"] == len(vocab.tokens)
    assert cfg["bos_token_id"] == vocab.id("<|im_start|>") and cfg["eos_token_id"] == vocab.id("<|im_end|>")
    gen = json.loads((out / "generation_config.json").read_text())
    assert gen["eos_token_id"] == [vocab.id("<|im_end|>"), vocab.id("<|endoftext|>")]


def test_bfloat16_conversion(tiny, tmp_path):
    path, ref, _ = tiny("llama", "mixed")
    out = tmp_path / "bf16"
    out.mkdir()
    convert_gguf(path, out, torch.bfloat16)
    with safe_open(str(out / "model.safetensors"), framework="pt") as f:
        for name in ref:
            t = f.get_tensor(name)
            assert t.dtype == torch.bfloat16
            assert torch.equal(t, ref[name].to(torch.bfloat16)), name
    assert json.loads((out / "config.json").read_text())["torch_dtype"] == "bfloat16"


# ---- tokenizer ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_tokenizer(tiny, arch):
    _, _, out = tiny(arch, "mixed")
    vocab = tiny_vocab()
    tok = AutoTokenizer.from_pretrained(out)
    for text in TEXTS:
        ids = tok.encode(text, add_special_tokens=False)
        assert tok.decode(ids) == text
    # BPE merges are applied in rank order: " the" and " capital" are single tokens.
    assert tok.encode(" the capital of", add_special_tokens=False) == [
        vocab.id("Ġthe"),
        vocab.id("Ġcapital"),
        vocab.id("Ġof"),
    ]
    # Control tokens (type 3) are special; user-defined ones (type 4) are added but not special.
    assert tok.encode("<|im_start|>", add_special_tokens=False) == [vocab.id("<|im_start|>")]
    assert tok.encode("<tool_call>", add_special_tokens=False) == [vocab.id("<tool_call>")]
    assert "<|im_end|>" in tok.all_special_tokens and "<tool_call>" not in tok.all_special_tokens
    assert tok.decode([vocab.id("<|im_end|>"), vocab.id("Ġthe")], skip_special_tokens=True) == " the"
    assert (tok.bos_token, tok.eos_token, tok.pad_token) == ("<|im_start|>", "<|im_end|>", "<|endoftext|>")
    # No BOS is added (tokenizer.ggml.add_bos_token is false).
    assert tok("the").input_ids == tok.encode("the", add_special_tokens=False)
    messages = [{"role": "user", "content": "hi"}]
    chat = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert chat == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert json.loads((out / "tokenizer_config.json").read_text())["chat_template"] == CHATML


def test_digits_are_split_per_pre_tokenizer(tiny):
    """smollm splits numbers into single digits; qwen2 does too (\\p{N} one at a time)."""
    for arch in ("llama", "qwen2"):
        _, _, out = tiny(arch, "f32")
        tok = AutoTokenizer.from_pretrained(out)
        assert len(tok.encode("12345", add_special_tokens=False)) == 5


# ---- errors ------------------------------------------------------------------------------------------


def test_unsupported_architecture(tmp_path):
    write_tiny_gguf(tmp_path / "m.gguf", "llama", "f32", arch_name="gemma3")
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(ValueError, match=r"'gemma3' is not supported \(supported: llama, qwen2\)"):
        convert_gguf(tmp_path / "m.gguf", out, torch.float32)


def test_unsupported_pre_tokenizer(tmp_path):
    write_tiny_gguf(tmp_path / "m.gguf", "llama", "f32", pre="some-new-model")
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(ValueError, match="pre-tokenizer 'some-new-model' is not supported"):
        convert_gguf(tmp_path / "m.gguf", out, torch.float32)


def test_not_a_gguf(tmp_path):
    (tmp_path / "x.gguf").write_bytes(b"NOPE" + bytes(100))
    with pytest.raises(ValueError, match="not a GGUF file"):
        GGUFFile(tmp_path / "x.gguf")


def test_invalid_utf8_in_a_key_names_the_file(tiny, tmp_path):
    path, _, _ = tiny("llama", "f32")
    data = path.read_bytes()
    key = b"general.architecture"
    at = data.index(key)
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(data[:at] + b"\xff" + data[at + 1 :])
    with pytest.raises(ValueError, match=rf"not valid UTF-8 .*: {re.escape(str(bad))}"):
        GGUFFile(bad)


@pytest.mark.parametrize(
    "add, match",
    [
        (lambda w, a: w.add_uint32(f"{a}.rope.dimension_count", 8), "rope.dimension_count=8, not the head size 16"),
        (lambda w, a: w.add_uint32(f"{a}.attention.value_length", 32), "attention.value_length=32, not the head"),
        (lambda w, a: w.add_float32(f"{a}.rope.scale_linear", 4.0), "rope.scale_linear=4.0: RoPE scaling"),
        (lambda w, a: w.add_uint32(f"{a}.attention.key_length", 8), "attn_q.weight has shape .*metadata implies"),
        (lambda w, a: w.add_uint32(f"{a}.vocab_size", 9999), "vocab_size=9999, but token_embd has"),
    ],
    ids=["partial-rope", "value-length", "scale-linear", "key-length", "vocab-size"],
)
def test_metadata_that_would_change_the_model_is_refused(tmp_path, add, match):
    """Keys the converter cannot honour are errors before anything is written (they were ignored)."""
    write_tiny_gguf(tmp_path / "m.gguf", "llama", "f32", metadata=add)
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(ValueError, match=match):
        convert_gguf(tmp_path / "m.gguf", out, torch.float32)


def test_llama3_tokenizer_ignores_merges_and_adds_bos_by_default(tmp_path):
    """llama.cpp's Llama 3 vocabulary: whole pre-tokens are looked up first, and BOS is added unless the GGUF
    says otherwise."""
    write_tiny_gguf(tmp_path / "m.gguf", "llama", "f32", pre="llama-bpe", add_bos=None)
    out = tmp_path / "out"
    out.mkdir()
    convert_gguf(tmp_path / "m.gguf", out, torch.float32)
    assert json.loads((out / "tokenizer.json").read_text())["model"]["ignore_merges"] is True
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert tokenizer("Paris").input_ids[0] == tokenizer.bos_token_id
