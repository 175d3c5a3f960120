"""``--quantization`` and ``--kv-cache-dtype`` on the command line: ``brisk serve`` / ``brisk bench`` pass them
to the engine, ``brisk generate`` / ``chat`` too; bad values are one-line errors before any loading."""

import argparse

import pytest

from brisk.entrypoints.cli.engine_args import add_engine_arguments, engine_kwargs
from brisk.entrypoints.cli.main import main


def test_serve_and_bench_flags_reach_the_engine_arguments():
    parser = argparse.ArgumentParser()
    add_engine_arguments(parser)
    args = parser.parse_args(["--quantization", "fp8", "--kv-cache-dtype", "fp8_e4m3"])
    assert engine_kwargs(args) == {"quantization": "fp8", "kv_cache_dtype": "fp8_e4m3"}
    assert engine_kwargs(parser.parse_args([])) == {}  # not given: the engine's defaults


@pytest.mark.parametrize(
    ("argv", "needle"),
    [(["--quantization", "int3"], "quantization must be one of"), (["--kv-cache-dtype", "int8"], "kv_cache_dtype")],
)
def test_generate_refuses_bad_values(capsys, argv, needle):
    assert main(["generate", "hello", *argv]) == 1
    err = capsys.readouterr().err
    assert err.startswith("brisk generate: error: ") and needle in err and err.count("\n") == 1


def test_generate_runs_quantized(tiny_llama, capsys):
    rc = main(["generate", "hello", "--model", tiny_llama, "--device", "cpu", "--quantization", "fp8",
               "--kv-cache-dtype", "fp8", "--max-tokens", "3", "--raw"])  # fmt: skip
    assert rc == 0, capsys.readouterr().err
