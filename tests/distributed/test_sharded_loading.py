"""A tensor-parallel rank reads only its shard of each checkpoint tensor: what leaves the safetensors file is exactly
what the rank's parameters hold, and the parameters equal those cut from the whole tensors."""

from __future__ import annotations

import pytest
import torch

from brisk.config import read_hf_config
from brisk.distributed.parallel_state import init_tensor_parallel
from brisk.loader.weights import iterate_safetensors
from brisk.models.registry import get_model_class
from tests.tiny_models import make_tiny_model


@pytest.fixture
def rank_1_of_2():
    """This process plays rank 1 of two while it builds and loads a model (loading needs no collectives)."""
    init_tensor_parallel(1, 2)
    yield
    init_tensor_parallel(0, 1)


def _gguf_folder(tmp_path):
    """A quantized GGUF as brisk serves it: converted (streaming, once, by the driver) into a safetensors folder."""
    from brisk.loader.gguf import convert_gguf
    from tests.loader.gguf_fixtures import write_tiny_gguf

    write_tiny_gguf(tmp_path / "model.gguf", "qwen2", "mixed")
    (tmp_path / "hf").mkdir()
    convert_gguf(tmp_path / "model.gguf", tmp_path / "hf", torch.float32)
    return tmp_path / "hf"


@pytest.mark.parametrize(("arch", "kv_heads"), [("llama", 2), ("qwen2", 1), ("qwen3", 4), ("gguf", None)])
def test_rank_reads_only_its_shard(tmp_path, arch, kv_heads, rank_1_of_2):
    if arch == "gguf":
        folder = _gguf_folder(tmp_path)
    else:
        folder = make_tiny_model(tmp_path / arch, arch, num_kv_heads=kv_heads)
    config = read_hf_config(folder)
    cpu = torch.device("cpu")

    def build():
        return get_model_class(config)(config, torch.float32, 128, "torch")

    lazy, whole = build(), build()
    read = []

    def tracked():
        for name, tensor in iterate_safetensors(folder, cpu, lazy=True):
            read.append(tensor)
            yield name, tensor

    lazy.load_weights(tracked())
    whole.load_weights(iterate_safetensors(folder, cpu))
    for (name, a), (_, b) in zip(lazy.named_parameters(), whole.named_parameters(), strict=True):
        assert torch.equal(a, b), name
    assert sum(t.num_elements_read for t in read) == sum(p.numel() for p in lazy.parameters())
    checkpoint_elements = sum(t.shape.numel() for t in read)
    assert sum(p.numel() for p in lazy.parameters()) < 0.6 * checkpoint_elements
