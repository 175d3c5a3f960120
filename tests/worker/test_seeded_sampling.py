"""Seeded requests at the sampler: each row draws its noise from its request's own stream on the sampling device,
so its token depends on its seed alone (not on the batch around it), and over many seeds the tokens follow the
tempered softmax. On a GPU this runs the device-side streams (one kernel a seeded row, no host-drawn noise)."""

import torch

from brisk.engine.request import Request
from brisk.sampling_params import SamplingParams
from brisk.worker.sampler import Sampler
from tests.spec_decode.test_rejection_sampler import chi_square_p_value

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
LOGITS = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0, -3.0, 0.25])
TEMPERATURE = 0.7


def seeded(seeds, temperature: float = TEMPERATURE) -> list[Request]:
    params = [SamplingParams(temperature=temperature, seed=s) for s in seeds]
    return [Request(f"r{s}", [1, 2, 3], p, frozenset()) for s, p in zip(seeds, params)]


def sample(requests: list[Request]) -> list[int]:
    sampler = Sampler(DEVICE, seed=0)
    out = sampler(LOGITS.to(DEVICE).repeat(len(requests), 1), requests)
    return out.token_ids.tolist()


def test_seeded_rows_follow_the_tempered_softmax_and_ignore_the_batch():
    seeds = range(3000)
    tokens = sample(seeded(seeds))
    counts = torch.bincount(torch.tensor(tokens), minlength=len(LOGITS)).double()
    assert chi_square_p_value(counts, (LOGITS / TEMPERATURE).softmax(-1).double()) > 0.001
    assert sample(seeded(seeds)) == tokens  # fresh requests, same seeds: the same tokens
    assert [sample(seeded([s]))[0] for s in range(20)] == tokens[:20]  # alone as in a batch of 3000
    # A greedy row among them takes its argmax and leaves the others' tokens as they were.
    mixed = seeded(range(20))
    mixed[5] = seeded([5], temperature=0.0)[0]
    assert sample(mixed) == tokens[:5] + [0] + tokens[6:20]


def test_a_request_draws_its_noise_on_the_sampling_device_from_its_own_stream():
    request, twin = seeded([7, 7])
    assert request.noise_generator(DEVICE).device.type == DEVICE.type
    first = [sample([request])[0] for _ in range(12)]  # the stream advances: twelve draws, not one repeated
    assert [sample([twin])[0] for _ in range(12)] == first
    assert len(set(first)) > 1
