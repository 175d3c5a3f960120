"""W3 (`brisk bench latency` on the Llama-3.1-8B shape) with the decode-attention launch changed, on a GPU (not a
test): the figures of benchmarks/results/HISTORY.md's "Where W3's time goes" (fourth run).

    python benchmarks/w3_variants.py OUT.json [tile=64 stages=2 part=64 warps=8 splits=1 | no-attention]

``tile``, ``stages``, ``part`` and ``warps`` replace the decode kernel's keys per tile, pipeline stages, fewest
keys per split and warps; ``splits`` its split count; ``no-attention`` skips attention on decode steps (an empty
output, no kernel), which leaves the weight reads and everything else of the step.
"""

from __future__ import annotations

import sys

import torch

from brisk.entrypoints.cli.main import main
from brisk.layers.attention import triton_backend
from brisk.layers.attention import triton_kernels as tk


def patch(options: list[str]) -> None:
    settings = dict(option.split("=") for option in options if "=" in option)
    if "no-attention" in options:
        forward = triton_backend.TritonAttentionImpl.forward

        def skip_decode(self, query, key, value, kv_cache, metadata, rotary_emb=None, positions=None):
            if metadata.is_decode_only:
                return torch.empty(query.shape, dtype=query.dtype, device=query.device)
            return forward(self, query, key, value, kv_cache, metadata, rotary_emb, positions)

        triton_backend.TritonAttentionImpl.forward = skip_decode
    names = {"tile": "tile_n", "stages": "num_stages", "part": "min_partition", "warps": "num_warps"}
    overrides = {names[key]: int(value) for key, value in settings.items() if key in names}
    if overrides:
        default = tk._decode_launch

        def decode_launch(head_p2: int, num_seqs: int, device: torch.device, fp8: bool = False) -> tk.DecodeLaunch:
            return default(head_p2, num_seqs, device, fp8)._replace(**overrides)

        tk._decode_launch = decode_launch
    if "splits" in settings:
        tk.decode_num_splits = lambda *args: int(settings["splits"])


if __name__ == "__main__":
    patch(sys.argv[2:])
    sys.argv = ["brisk", "bench", "latency", "--model", "llama-3.1-8b-shape", "--output-json", sys.argv[1]]
    main()
