"""compressed-tensors checkpoints (the format llmcompressor writes): ``quant_method: compressed-tensors``."""

from brisk.layers.quantization.compressed_tensors.config import CompressedTensorsConfig

__all__ = ["CompressedTensorsConfig"]
