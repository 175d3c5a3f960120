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
