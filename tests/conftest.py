import os

import pytest
import torch

# Without a GPU, Triton kernels run in its interpreter; the variable must be set before triton is imported.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from tests.tiny_models import make_tiny_model  # noqa: E402

torch.set_num_threads(1)  # tiny models: threads only add contention

ARCHS = ("llama", "qwen2", "qwen3")


@pytest.fixture(scope="session")
def tiny_model_factory(tmp_path_factory):
    cache: dict[str, str] = {}

    def get(arch: str = "llama") -> str:
        if arch not in cache:
            cache[arch] = str(make_tiny_model(tmp_path_factory.mktemp(f"tiny-{arch}"), arch))
        return cache[arch]

    return get


@pytest.fixture(scope="session")
def tiny_llama(tiny_model_factory) -> str:
    return tiny_model_factory("llama")


@pytest.fixture(scope="session")
def ct_checkpoint(tiny_llama, tmp_path_factory):
    """``ct_checkpoint(preset, **weight_args)``: a compressed-tensors checkpoint of the tiny Llama, made once per
    test session (see ``ct_checkpoints.make_ct_checkpoint``)."""
    from tests.quantization.ct_checkpoints import make_ct_checkpoint

    cache: dict[tuple, str] = {}

    def get(preset: str, **weight_args) -> str:
        key = (preset, *sorted(weight_args.items()))
        if key not in cache:
            out = tmp_path_factory.mktemp("ct-" + "-".join(map(str, key)).replace(" ", ""))
            cache[key] = make_ct_checkpoint(tiny_llama, out, preset, **weight_args)
        return cache[key]

    return get
