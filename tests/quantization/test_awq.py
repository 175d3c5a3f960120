"""AWQ checkpoints (AutoAWQ's GEMM layout). AutoAWQ no longer installs beside the transformers brisk tests
against, so the test writes the layout itself (round-to-nearest 4-bit groups, AWQ's interleaved packing,
float16 scales) and takes its reference from compressed-tensors' ``AutoAWQConverter``, the library's reading of
that layout: brisk's weights equal the converted checkpoint's dequantization, and its greedy tokens equal the
library's reference model on it."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from brisk import LLM
from tests.quantization.awq_checkpoints import make_awq_checkpoint
from tests.quantization.ct_checkpoints import library_reference_model
from tests.quantization.dequantized import assert_weights_equal, brisk_greedy, reference_greedy

PROMPTS = ["The quick brown fox", "Paris is the capital of", "def add(a, b):"]


def converted(awq_folder: str, out: Path) -> str:
    """The AWQ checkpoint converted by compressed-tensors' AutoAWQConverter into a compressed-tensors one."""
    from compressed_tensors.entrypoints.convert.converters.autoawq import AutoAWQConverter

    converter = AutoAWQConverter.from_pretrained(awq_folder)
    shutil.copytree(awq_folder, out)
    save_file(converter.process(load_file(out / "model.safetensors")), out / "model.safetensors")
    config = json.loads((out / "config.json").read_text())
    quant = converter.update_config(None)
    config["quantization_config"] = {**quant.model_dump(mode="json"), "quant_method": "compressed-tensors"}
    (out / "config.json").write_text(json.dumps(config))
    return str(out)


@pytest.fixture(scope="module", params=[True, False], ids=["zero-point", "symmetric"])
def awq_pair(request, tiny_llama, tmp_path_factory):
    folder = make_awq_checkpoint(tiny_llama, tmp_path_factory.mktemp("awq") / "m", request.param)
    return folder, converted(folder, tmp_path_factory.mktemp("awq-ct") / "m")


def test_weights_equal_the_library_dequantization(awq_pair):
    from compressed_tensors.compressors.pack_quantized.helpers import unpack_from_int32
    from compressed_tensors.quantization import QuantizationArgs
    from compressed_tensors.quantization.lifecycle.forward import dequantize

    awq, ct = awq_pair
    config = json.loads((Path(ct) / "config.json").read_text())["quantization_config"]
    args = QuantizationArgs.model_validate(next(iter(config["config_groups"].values()))["weights"])
    state = load_file(Path(ct) / "model.safetensors")

    def library(name: str) -> torch.Tensor:
        shape = state[f"{name}.weight_shape"].tolist()
        q = unpack_from_int32(state[f"{name}.weight_packed"], 4, shape)
        scale = state[f"{name}.weight_scale"].float()
        zero = state.get(f"{name}.weight_zero_point")
        if zero is not None:
            zero = unpack_from_int32(zero, 4, [shape[0], scale.shape[1]], packed_dim=0)
        return dequantize(q, scale, zero, args=args, dtype=torch.float32)

    assert_weights_equal(LLM(awq, device="cpu", kv_cache_memory_bytes=1 << 22), library)


def test_greedy_matches_library_reference(awq_pair, tiny_llama):
    awq, ct = awq_pair
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(awq)
    model = library_reference_model(tiny_llama, ct)  # computes in the float16 scales' precision
    llm = LLM(awq, device="cpu", kv_cache_memory_bytes=1 << 22)
    assert brisk_greedy(llm, PROMPTS) == reference_greedy(model, tokenizer, PROMPTS)


def test_unsupported_awq_versions(tiny_llama, tmp_path):
    folder = make_awq_checkpoint(tiny_llama, tmp_path / "m", True)
    config = json.loads((Path(folder) / "config.json").read_text())
    config["quantization_config"]["version"] = "gemv"
    (Path(folder) / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="AWQ checkpoint with version 'gemv': brisk loads AutoAWQ's GEMM layout"):
        LLM(folder, device="cpu")
