"""GGUF files: a fast metadata reader and a converter to an HF-style checkpoint folder.

The converter turns a llama.cpp GGUF (``llama`` or ``qwen2`` architecture) into what the engine loads like
any Hugging Face checkpoint: ``config.json``, ``model.safetensors`` (HF tensor names, weights dequantized
into the requested dtype), tokenizer files and ``generation_config.json``.

Why not ``gguf.GGUFReader`` for the metadata: it parses every element of an array field with numpy, which
takes ~6 s for SmolLM2's 49k-token vocabulary and ~20 s for Qwen's 151k; :class:`GGUFFile` parses the same
header in well under a second and can read a GGUF that is split into consecutive byte slices (the part
packages of ``MODELS.md``) without assembling it. Tensor payloads are still decoded by
``gguf.quants.dequantize``; the tests check this reader against ``gguf.GGUFReader`` field by field.
"""

from __future__ import annotations

import errno
import json
import logging
import math
import os
import shutil
import struct
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType
from gguf.quants import dequantize, quant_shape_to_byte_shape

from brisk.loader.gguf_tokenizer import eos_token_ids, save_tokenizer

logger = logging.getLogger(__name__)

GGUF_MAGIC = b"GGUF"
_DEQUANT_CHUNK = 1 << 18  # values per gguf.quants.dequantize call
SUPPORTED_ARCHS = ("llama", "qwen2")
_HF_ARCH = {"llama": ("LlamaForCausalLM", "llama"), "qwen2": ("Qwen2ForCausalLM", "qwen2")}

# Scalar value types of the GGUF key/value section: struct code per GGUFValueType.
_SCALAR_FMT = {
    GGUFValueType.UINT8: "B",
    GGUFValueType.INT8: "b",
    GGUFValueType.UINT16: "H",
    GGUFValueType.INT16: "h",
    GGUFValueType.UINT32: "I",
    GGUFValueType.INT32: "i",
    GGUFValueType.FLOAT32: "f",
    GGUFValueType.BOOL: "?",
    GGUFValueType.UINT64: "Q",
    GGUFValueType.INT64: "q",
    GGUFValueType.FLOAT64: "d",
}


class _NeedMore(Exception):
    """The header parser ran past the bytes it was given."""


@dataclass(frozen=True)
class GGUFTensorInfo:
    name: str
    qtype: GGMLQuantizationType
    shape: tuple[int, ...]  # numpy / PyTorch order, e.g. [out_features, in_features]
    offset: int  # absolute offset of the payload in the (possibly split) file
    nbytes: int


class _SplitFile:
    """Read-only view of consecutive files as one byte string (memory-mapped, zero copy within a part)."""

    def __init__(self, paths: Sequence[Path]):
        self.paths = [Path(p) for p in paths]
        if not self.paths:
            raise ValueError("no GGUF file given")
        self.sizes = [p.stat().st_size for p in self.paths]
        self.starts = [0]
        for s in self.sizes:
            self.starts.append(self.starts[-1] + s)
        self.size = self.starts[-1]
        self._maps: list[np.ndarray | None] = [None] * len(self.paths)

    def _map(self, i: int) -> np.ndarray:
        m = self._maps[i]
        if m is None:
            m = np.memmap(self.paths[i], dtype=np.uint8, mode="r") if self.sizes[i] else np.zeros(0, np.uint8)
            self._maps[i] = m
        return m

    def read(self, offset: int, n: int) -> np.ndarray:
        """``n`` bytes from ``offset`` as a uint8 array (a view when they lie inside one part)."""
        if offset < 0 or n < 0 or offset + n > self.size:
            raise ValueError(
                f"GGUF is truncated: wanted bytes [{offset}, {offset + n}) of a {self.size}-byte file "
                f"({', '.join(map(str, self.paths))})"
            )
        chunks = []
        end = offset + n
        for i, (lo, hi) in enumerate(zip(self.starts, self.starts[1:], strict=False)):
            if hi <= offset or lo >= end or lo == hi:
                continue
            a, b = max(offset, lo), min(end, hi)
            chunks.append(self._map(i)[a - lo : b - lo])
        if len(chunks) == 1:
            return chunks[0]
        return np.concatenate(chunks) if chunks else np.zeros(0, np.uint8)

    def close(self) -> None:
        self._maps = [None] * len(self.paths)


class GGUFFile:
    """Metadata and tensors of a GGUF file, or of a GGUF split into consecutive byte slices.

    ``fields`` maps each key to a plain Python value (str, int, float, bool, or a list of those);
    ``tensors`` maps each tensor name to its :class:`GGUFTensorInfo`, in file order.
    """

    def __init__(self, paths: str | os.PathLike | Sequence[str | os.PathLike]):
        if isinstance(paths, (str, os.PathLike)):
            paths = [paths]
        self._file = _SplitFile([Path(p) for p in paths])
        self.paths = self._file.paths
        self.fields: dict[str, Any] = {}
        self.tensors: dict[str, GGUFTensorInfo] = {}
        self.version = 0
        self.alignment = 32
        self.data_offset = 0
        n = min(self._file.size, 16 << 20)
        while True:
            buf = self._file.read(0, n).tobytes()
            try:
                self._parse(buf)
                break
            except _NeedMore:
                if n >= self._file.size:
                    raise ValueError(f"GGUF header is truncated or corrupt: {self.paths[0]}") from None
                n = min(self._file.size, 4 * n)
            except ValueError as exc:
                if str(self.paths[0]) in str(exc):
                    raise
                raise ValueError(f"{exc}: {self.paths[0]}") from None

    # -- header -------------------------------------------------------------------------------------
    def _parse(self, buf: bytes) -> None:
        if len(buf) < 24:
            raise _NeedMore
        if buf[:4] != GGUF_MAGIC:
            raise ValueError(f"not a GGUF file (bad magic {buf[:4]!r}): {self.paths[0]}")
        version, n_tensors, n_kv = struct.unpack_from("<IQQ", buf, 4)
        if version not in (2, 3):
            if version & 0xFFFF == 0:
                raise ValueError(f"big-endian GGUF files are not supported: {self.paths[0]}")
            raise ValueError(f"unsupported GGUF version {version}: {self.paths[0]}")
        self.version = version
        off = 24
        fields: dict[str, Any] = {}
        try:
            for _ in range(n_kv):
                key, off = _read_str(buf, off)
                (vtype,) = struct.unpack_from("<I", buf, off)
                off += 4
                fields[key], off = _read_value(buf, off, vtype)
            tensors: list[tuple[str, tuple[int, ...], int, int]] = []
            for _ in range(n_tensors):
                name, off = _read_str(buf, off)
                (n_dims,) = struct.unpack_from("<I", buf, off)
                dims = struct.unpack_from(f"<{n_dims}Q", buf, off + 4)
                off += 4 + 8 * n_dims
                qtype, rel = struct.unpack_from("<IQ", buf, off)
                off += 12
                tensors.append((name, dims, qtype, rel))
        except struct.error:
            raise _NeedMore from None
        align = int(fields.get("general.alignment", 32))
        if align <= 0 or align & (align - 1):
            raise ValueError(f"invalid general.alignment {align} in {self.paths[0]}")
        data_offset = off + (-off) % align
        infos: dict[str, GGUFTensorInfo] = {}
        for name, dims, raw_type, rel in tensors:
            if name in infos:
                raise ValueError(f"duplicate tensor {name!r} in {self.paths[0]}")
            try:
                qtype = GGMLQuantizationType(raw_type)
            except ValueError:
                raise ValueError(f"tensor {name!r} has unknown GGML type {raw_type}") from None
            block, type_size = GGML_QUANT_SIZES[qtype]
            n_elems = math.prod(dims)
            infos[name] = GGUFTensorInfo(
                name=name,
                qtype=qtype,
                shape=tuple(int(d) for d in reversed(dims)),
                offset=data_offset + rel,
                nbytes=n_elems * type_size // block,
            )
        self.fields, self.tensors, self.alignment, self.data_offset = fields, infos, align, data_offset

    # -- tensors ------------------------------------------------------------------------------------
    def raw(self, name: str) -> np.ndarray:
        """The tensor's stored bytes, shaped as ``gguf.quants.dequantize`` expects."""
        t = self.tensors[name]
        data = self._file.read(t.offset, t.nbytes)
        return data.reshape(quant_shape_to_byte_shape(t.shape, t.qtype))

    def dequantize(self, name: str) -> np.ndarray:
        """The tensor as a new float32 array, in its logical (numpy-order) shape.

        Same values as ``gguf.quants.dequantize(raw, qtype)``, but fed in chunks of ~256k values: gguf
        slices its input into groups of 16 rows, and on narrow matrices the Python overhead per group
        dominates (SmolLM2 dequantizes in ~1.4 s this way instead of ~2.5 s). Quant blocks never straddle
        rows, so any whole number of blocks can be dequantized on its own.
        """
        t = self.tensors[name]
        block, type_size = GGML_QUANT_SIZES[t.qtype]
        flat = self._file.read(t.offset, t.nbytes)
        n = math.prod(t.shape)
        out = np.empty(n, dtype=np.float32)
        n_blocks = n // block
        step = max(1, _DEQUANT_CHUNK // block)
        for b0 in range(0, n_blocks, step):
            b1 = min(n_blocks, b0 + step)
            chunk = flat[b0 * type_size : b1 * type_size].reshape(1, -1)
            out[b0 * block : b1 * block] = dequantize(chunk, t.qtype).reshape(-1)
        return out.reshape(t.shape)

    def get(self, key: str, default: Any = None) -> Any:
        return self.fields.get(key, default)

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> GGUFFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _read_str(buf: bytes, off: int) -> tuple[str, int]:
    (n,) = struct.unpack_from("<Q", buf, off)
    off += 8
    if off + n > len(buf):
        raise _NeedMore
    try:
        return buf[off : off + n].decode("utf-8"), off + n
    except UnicodeDecodeError as exc:
        raise ValueError(f"a GGUF string at byte {off} is not valid UTF-8 ({exc.reason})") from None


def _read_value(buf: bytes, off: int, vtype: int) -> tuple[Any, int]:
    try:
        vt = GGUFValueType(vtype)
    except ValueError:
        raise ValueError(f"unknown GGUF value type {vtype}") from None
    if vt == GGUFValueType.STRING:
        return _read_str(buf, off)
    if vt in _SCALAR_FMT:
        fmt = "<" + _SCALAR_FMT[vt]
        (v,) = struct.unpack_from(fmt, buf, off)
        return v, off + struct.calcsize(fmt)
    if vt == GGUFValueType.ARRAY:
        itype, count = struct.unpack_from("<IQ", buf, off)
        off += 12
        try:
            it = GGUFValueType(itype)
        except ValueError:
            raise ValueError(f"unknown GGUF array item type {itype}") from None
        if it == GGUFValueType.STRING:
            out = []
            unpack, decode_end = struct.unpack_from, len(buf)
            for _ in range(count):
                (n,) = unpack("<Q", buf, off)
                off += 8
                if off + n > decode_end:
                    raise _NeedMore
                out.append(buf[off : off + n].decode("utf-8"))
                off += n
            return out, off
        if it in _SCALAR_FMT:
            dt = np.dtype("<" + _SCALAR_FMT[it]) if it != GGUFValueType.BOOL else np.dtype(np.bool_)
            end = off + dt.itemsize * count
            if end > len(buf):
                raise _NeedMore
            return np.frombuffer(buf, dtype=dt, count=count, offset=off).tolist(), end
        out = []
        for _ in range(count):  # arrays of arrays: rare, parse generically
            v, off = _read_value(buf, off, itype)
            out.append(v)
        return out, off
    raise ValueError(f"unhandled GGUF value type {vt.name}")


# -------------------------------------------------------------------------------------------------------
# Conversion to an HF-style folder
# -------------------------------------------------------------------------------------------------------

_LAYER_MAP = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_GLOBAL_MAP = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_ST_DTYPE = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16"}


def hf_tensor_name(gguf_name: str) -> str:
    """The HF (Llama/Qwen2) name of a llama.cpp tensor name; ``ValueError`` for names we cannot map."""
    if gguf_name in _GLOBAL_MAP:
        return _GLOBAL_MAP[gguf_name]
    parts = gguf_name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in _LAYER_MAP:
        return f"model.layers.{parts[1]}.{_LAYER_MAP[parts[2]]}"
    raise ValueError(f"GGUF tensor {gguf_name!r} has no Llama/Qwen2 equivalent (unsupported model variant)")


def unpermute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's ``permute`` of Q/K rows (interleaved RoPE pairs -> HF rotate-half halves).

    llama.cpp's ``convert_hf_to_gguf.py`` reshapes each head's rows as ``(2, head_dim/2)`` and swaps the
    axes; the inverse reads them as ``(head_dim/2, 2)`` and swaps back. Works on weights and biases.
    """
    rows = w.shape[0]
    if rows % (2 * n_head):
        raise ValueError(f"cannot un-permute {rows} rows into {n_head} heads")
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def permute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's ``permute`` (HF layout -> GGUF layout); the inverse of :func:`unpermute_qk`."""
    rows = w.shape[0]
    return w.reshape(n_head, 2, rows // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


@dataclass
class GGUFModelInfo:
    arch: str
    config: dict[str, Any]
    tensor_names: dict[str, str]  # gguf name -> HF name, in file order


def _check_shapes(g: GGUFFile, hidden: int, q_rows: int, kv_rows: int, ffn: int) -> None:
    """The metadata's sizes must be the tensors' (a config that disagrees with its weights fails only later, in
    the engine, after a broken folder has been cached)."""
    expected = {
        "token_embd.weight": (None, hidden),
        "blk.0.attn_q.weight": (q_rows, hidden),
        "blk.0.attn_k.weight": (kv_rows, hidden),
        "blk.0.attn_v.weight": (kv_rows, hidden),
        "blk.0.ffn_up.weight": (ffn, hidden),
    }
    for name, (rows, cols) in expected.items():
        info = g.tensors.get(name)
        if info is None:
            raise ValueError(f"GGUF has no {name}: {g.paths[0]}")
        got_rows, got_cols = info.shape[0], info.shape[-1]
        if (rows is not None and got_rows != rows) or got_cols != cols:
            raise ValueError(
                f"GGUF tensor {name} has shape {tuple(info.shape)}, but the metadata implies "
                f"({rows if rows is not None else got_rows}, {cols}): {g.paths[0]}"
            )


def _check_vocabulary(g: GGUFFile, arch: str, vocab_size: int) -> None:
    """Every token the tokenizer can produce must have an embedding row."""
    tokens = g.get("tokenizer.ggml.tokens")
    declared = g.get(f"{arch}.vocab_size")
    if declared is not None and int(declared) != vocab_size:
        raise ValueError(f"GGUF sets {arch}.vocab_size={declared}, but token_embd has {vocab_size} rows: {g.paths[0]}")
    if tokens is not None and len(tokens) > vocab_size:
        raise ValueError(
            f"GGUF's tokenizer has {len(tokens)} tokens, but token_embd has only {vocab_size} rows: {g.paths[0]}"
        )


def read_model_info(g: GGUFFile, dtype: torch.dtype) -> GGUFModelInfo:
    """Build the HF ``config.json`` dict and the tensor-name map of a GGUF; checks the architecture."""
    arch = g.get("general.architecture")
    if arch not in SUPPORTED_ARCHS:
        raise ValueError(
            f"GGUF architecture {arch!r} is not supported (supported: {', '.join(SUPPORTED_ARCHS)}): "
            f"{g.paths[0]}"
        )

    def need(key: str) -> Any:
        v = g.get(f"{arch}.{key}")
        if v is None:
            raise ValueError(f"GGUF is missing {arch}.{key}: {g.paths[0]}")
        return v

    n_layers = int(need("block_count"))
    hidden = int(need("embedding_length"))
    n_head = int(need("attention.head_count"))
    n_kv = int(g.get(f"{arch}.attention.head_count_kv", n_head))
    head_dim = int(g.get(f"{arch}.attention.key_length", hidden // n_head))
    if "token_embd.weight" not in g.tensors:
        raise ValueError(f"GGUF has no token_embd.weight: {g.paths[0]}")
    vocab_size = g.tensors["token_embd.weight"].shape[0]
    tied = "output.weight" not in g.tensors
    names = {}
    for name in g.tensors:
        if name == "rope_freqs.weight":
            raise ValueError("GGUF uses per-dimension RoPE frequency factors (Llama-3.1 style): unsupported")
        names[name] = hf_tensor_name(name)
    for key in (f"{arch}.rope.scaling.type", f"{arch}.rope.scaling.factor", f"{arch}.rope.scale_linear"):
        v = g.get(key)
        if v not in (None, "none", 0, 1, 0.0, 1.0):
            raise ValueError(f"GGUF sets {key}={v!r}: RoPE scaling is not supported by the GGUF converter")
    for key in ("rope.dimension_count", "attention.value_length"):  # partial RoPE, values of another width
        v = g.get(f"{arch}.{key}")
        if v is not None and int(v) != head_dim:
            raise ValueError(f"GGUF sets {arch}.{key}={v}, not the head size {head_dim}: unsupported: {g.paths[0]}")
    if f"{arch}.feed_forward_length" in g.fields:
        ffn = int(g.fields[f"{arch}.feed_forward_length"])
    else:
        ffn = g.tensors["blk.0.ffn_up.weight"].shape[0]
    _check_shapes(g, hidden, n_head * head_dim, n_kv * head_dim, ffn)
    _check_vocabulary(g, arch, vocab_size)
    rope_theta = float(g.get(f"{arch}.rope.freq_base", 10000.0))
    ctx = int(g.get(f"{arch}.context_length", 2048))
    hf_arch, model_type = _HF_ARCH[arch]
    cfg: dict[str, Any] = {
        "architectures": [hf_arch],
        "model_type": model_type,
        "vocab_size": vocab_size,
        "hidden_size": hidden,
        "intermediate_size": ffn,
        "num_hidden_layers": n_layers,
        "num_attention_heads": n_head,
        "num_key_value_heads": n_kv,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": ctx,
        "rms_norm_eps": float(need("attention.layer_norm_rms_epsilon")),
        # transformers < 5 reads rope_theta, transformers >= 5 reads rope_parameters: write both.
        "rope_theta": rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": rope_theta},
        "rope_scaling": None,
        "tie_word_embeddings": tied,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "use_cache": True,
        "torch_dtype": str(dtype).removeprefix("torch."),
    }
    for key, tok_key in (
        ("bos_token_id", "bos_token_id"),
        ("eos_token_id", "eos_token_id"),
        ("pad_token_id", "padding_token_id"),
    ):
        v = g.get(f"tokenizer.ggml.{tok_key}")
        if v is not None:
            cfg[key] = int(v)
    if arch == "llama":
        cfg.update(attention_bias="blk.0.attn_q.bias" in g.tensors, mlp_bias=False, pretraining_tp=1)
    else:
        cfg.update(use_sliding_window=False, sliding_window=None, max_window_layers=n_layers)
    return GGUFModelInfo(arch=arch, config=cfg, tensor_names=names)


def iter_hf_tensors(
    g: GGUFFile, info: GGUFModelInfo, dtype: torch.dtype
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(hf_name, tensor)`` one at a time: dequantized, un-permuted (llama Q/K), cast to ``dtype``."""
    n_head = info.config["num_attention_heads"]
    n_kv = info.config["num_key_value_heads"]
    for gname, hname in info.tensor_names.items():
        w = g.dequantize(gname)
        if info.arch == "llama":
            if hname.endswith("q_proj.weight") or hname.endswith("q_proj.bias"):
                w = unpermute_qk(w, n_head)
            elif hname.endswith("k_proj.weight") or hname.endswith("k_proj.bias"):
                w = unpermute_qk(w, n_kv)
        t = torch.from_numpy(np.ascontiguousarray(w))  # w is a fresh, writable array
        yield hname, t.to(dtype) if dtype != torch.float32 else t


def write_safetensors_streaming(
    path: Path,
    specs: Sequence[tuple[str, tuple[int, ...]]],
    dtype: torch.dtype,
    tensors: Iterator[tuple[str, torch.Tensor]],
    metadata: dict[str, str] | None = None,
) -> None:
    """Write a ``.safetensors`` file whose header is known up front, one tensor at a time.

    Memory stays bounded by the largest tensor instead of the whole model (``safetensors.torch.save_file``
    needs every tensor in memory at once).
    """
    st_dtype = _ST_DTYPE[dtype]
    itemsize = torch.empty((), dtype=dtype).element_size()
    header: dict[str, Any] = {"__metadata__": {"format": "pt", **(metadata or {})}}
    off = 0
    for name, shape in specs:
        n = math.prod(shape) * itemsize
        header[name] = {"dtype": st_dtype, "shape": list(shape), "data_offsets": [off, off + n]}
        off += n
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * ((-len(blob)) % 8)
    expected = dict(specs)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for (name, shape), (tname, t) in zip(specs, tensors, strict=True):
            if tname != name or tuple(t.shape) != tuple(expected[name]) or t.dtype != dtype:
                raise RuntimeError(
                    f"tensor stream out of order: got {tname} {tuple(t.shape)} {t.dtype}, "
                    f"expected {name} {shape} {dtype}"
                )
            t = t.contiguous()
            f.write(t.view(torch.uint8).numpy().data if t.numel() else b"")
        if f.tell() != 8 + len(blob) + off:
            raise RuntimeError(f"safetensors size mismatch writing {path}")


def convert_gguf(
    src: str | os.PathLike | Sequence[str | os.PathLike],
    out_dir: str | os.PathLike,
    dtype: torch.dtype = torch.bfloat16,
    *,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Convert a GGUF (one file, or consecutive byte slices of one) into an HF-style folder ``out_dir``.

    ``out_dir`` must exist (the caller is expected to use a temporary folder and rename it). Returns the
    ``config.json`` dict. Raises ``ValueError`` for unsupported architectures, tokenizers or tensors.
    """
    if dtype not in _ST_DTYPE:
        raise ValueError(f"unsupported dtype {dtype}: use torch.float32, torch.float16 or torch.bfloat16")
    out = Path(out_dir)
    with GGUFFile(src) as g:
        info = read_model_info(g, dtype)
        # Tokenizer first: it is cheap and fails early on unsupported vocabularies.
        save_tokenizer(g.fields, out)
        eos_ids = eos_token_ids(g.fields)
        if eos_ids:
            info.config["eos_token_id"] = eos_ids[0]
        specs = [(info.tensor_names[n], g.tensors[n].shape) for n in info.tensor_names]
        _check_free_space(out, sum(math.prod(shape) for _, shape in specs) * dtype.itemsize)
        write_safetensors_streaming(
            out / "model.safetensors",
            specs,
            dtype,
            iter_hf_tensors(g, info, dtype),
            metadata={"source": "gguf", "architecture": info.arch},
        )
        (out / "config.json").write_text(json.dumps(info.config, indent=2) + "\n")
        gen: dict[str, Any] = {"_from_model_config": False}
        if "bos_token_id" in info.config:
            gen["bos_token_id"] = info.config["bos_token_id"]
        if eos_ids:
            gen["eos_token_id"] = eos_ids[0] if len(eos_ids) == 1 else eos_ids
        if "pad_token_id" in info.config:
            gen["pad_token_id"] = info.config["pad_token_id"]
        (out / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
    if progress:
        progress(f"converted {info.arch} GGUF into {out}")
    return info.config


def _check_free_space(out: Path, needed: int) -> None:
    free = shutil.disk_usage(out).free
    if free < needed + (64 << 20):
        raise OSError(
            errno.ENOSPC,
            f"Not enough disk space to convert the GGUF: {needed / 2**30:.1f} GiB of weights to write, "
            f"{free / 2**30:.1f} GiB free under {out.parent}. Free some space, point BRISK_CACHE_DIR at a "
            "larger disk, or use a smaller dtype (bfloat16 needs half the space of float32).",
        )
