"""A checkpoint tensor that is read from its safetensors file only where it is indexed.

Tensor-parallel ranks load through it so each reads its own shard: the weight loaders take a ``narrow`` or a
slice of the whole tensor, and only those bytes leave the file. Anything else torch does with it (``copy_`` into
a replicated parameter, ``torch.equal``) reads it whole, through ``__torch_function__``."""

from __future__ import annotations

import torch

_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "U16": torch.uint16,
    "U32": torch.uint32,
    "U64": torch.uint64,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
    "BOOL": torch.bool,
}


class LazyTensor:
    def __init__(self, safe_slice):
        self._slice = safe_slice
        self.shape = torch.Size(safe_slice.get_shape())
        if safe_slice.get_dtype() not in _DTYPES:
            raise ValueError(f"safetensors dtype {safe_slice.get_dtype()!r} is not supported")
        self.dtype = _DTYPES[safe_slice.get_dtype()]
        self.num_elements_read = 0  # what left the file so far (tests check that a rank reads only its shard)

    def dim(self) -> int:
        return len(self.shape)

    def numel(self) -> int:
        return self.shape.numel()

    def is_floating_point(self) -> bool:
        return self.dtype.is_floating_point

    def __getitem__(self, index) -> torch.Tensor:
        tensor = self._slice[index]
        self.num_elements_read += tensor.numel()
        return tensor

    def narrow(self, dim: int, start: int, length: int) -> torch.Tensor:
        return self[(slice(None),) * dim + (slice(start, start + length),)]

    def load(self) -> torch.Tensor:
        return self[(slice(None),) * self.dim()] if self.dim() else self[()]

    def to(self, *args, **kwargs) -> torch.Tensor:
        return self.load().to(*args, **kwargs)

    def reshape(self, *shape) -> torch.Tensor:
        return self.load().reshape(*shape)

    def __float__(self) -> float:
        return float(self.load())

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        def load(x):
            if isinstance(x, LazyTensor):
                return x.load()
            if isinstance(x, (list, tuple)):
                return type(x)(load(item) for item in x)
            return x

        return func(*load(args), **{k: load(v) for k, v in (kwargs or {}).items()})
