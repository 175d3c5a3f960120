"""brisk: fast, memory-efficient LLM inference and serving."""

from brisk.llm import LLM
from brisk.outputs import CompletionOutput, Logprob, RequestOutput
from brisk.sampling_params import SamplingParams

__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput", "Logprob"]
__version__ = "0.1.0"
