import pytest


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
