"""``brisk bench startup`` (W7): seconds from the start of engine construction to the first generated token,
measured in a fresh Python process so imports and CUDA initialization are cold; import time reported apart."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from brisk.bench import configs, report
from brisk.bench.common import check_engine_flags, engine_kwargs

# Runs in the child. Times `import torch`, then `from brisk import LLM`, then LLM(...), then a 1-token generate.
_CHILD = """
import time
t0 = time.perf_counter()
import json, sys
import torch
t1 = time.perf_counter()
from brisk import LLM, SamplingParams
t2 = time.perf_counter()
model, kwargs, prompt_len, out_path = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
try:
    llm = LLM(model=model, **kwargs)
    t3 = time.perf_counter()
    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True, detokenize=False)
    out = llm.generate([[(7 * i + 11) % 10000 for i in range(prompt_len)]], params, use_tqdm=False)
    t4 = time.perf_counter()
except (ValueError, FileNotFoundError, RuntimeError) as exc:  # an error that says what to change: to the parent
    json.dump({"error": str(exc)}, open(out_path, "w"))
    sys.exit(0)
engine = llm.engine
device = str(engine.device)
name = torch.cuda.get_device_name(engine.device) if engine.device.type == "cuda" else "cpu"
json.dump({
    "import_torch_s": t1 - t0, "import_brisk_s": t2 - t1, "import_s": t2 - t0,
    "engine_init_s": t3 - t2, "first_token_s": t4 - t3, "startup_s": t4 - t2,
    "generated_tokens": len(out[0].outputs[0].token_ids), "device": device, "device_name": name,
    "attention_backend": getattr(engine, "attention_backend", None),
    "engine_phases_s": {k: round(v, 3) for k, v in engine.startup_seconds.items()},
}, open(out_path, "w"))
"""


def run_child(model: str, kwargs: dict, prompt_len: int) -> dict:
    repo_root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (repo_root, os.environ.get("PYTHONPATH")) if p)}
    with tempfile.TemporaryDirectory(prefix="brisk-startup-") as tmp:
        out_path = Path(tmp) / "startup.json"
        cmd = [sys.executable, "-c", _CHILD, model, json.dumps(kwargs), str(prompt_len), str(out_path)]
        start = time.perf_counter()
        proc = subprocess.run(cmd, env=env)
        wall = time.perf_counter() - start
        if proc.returncode != 0 or not out_path.is_file():
            raise RuntimeError(f"the startup child process exited with {proc.returncode}")
        result = json.loads(out_path.read_text())
    if "error" in result:
        raise ValueError(result["error"])
    result["process_wall_s"] = wall
    return {k: round(v, 3) if isinstance(v, float) else v for k, v in result.items()}


def run(args: argparse.Namespace) -> int:
    if args.repeats < 1 or args.prompt_len < 1:
        raise ValueError("--repeats and --prompt-len must be >= 1.")
    check_engine_flags(args)
    kwargs = engine_kwargs(args)
    with configs.materialize(args.model) as model:
        runs = []
        for i in range(args.repeats):
            print(f"== startup run {i + 1}/{args.repeats} (fresh process)", flush=True)
            runs.append(run_child(model, kwargs, args.prompt_len))
    keys = (
        "startup_s",
        "engine_init_s",
        "first_token_s",
        "import_s",
        "import_torch_s",
        "import_brisk_s",
        "process_wall_s",
    )
    summary = {f"{k}_median": round(statistics.median(r[k] for r in runs), 3) for k in keys}
    results = {"brisk": {"backend": "brisk", "runs": runs, **summary, "device_name": runs[0]["device_name"]}}
    env = report.environment()
    env["device_name"] = runs[0]["device_name"]
    config = {"model": args.model, "engine_args": kwargs, "prompt_len": args.prompt_len, "repeats": args.repeats}
    data = report.make_report(
        "startup",
        args,
        config,
        results,
        env,
        workload={"name": "W7", "definition": "engine construction start to first token"},
    )
    print(f"\nbrisk bench startup (W7): {args.model}, device {env['device_name']}")
    rows = [
        [str(i + 1), r["startup_s"], r["engine_init_s"], r["first_token_s"], r["import_s"], r["process_wall_s"]]
        for i, r in enumerate(runs)
    ]
    print(report.table(["run", "startup s", "engine init s", "first token s", "import s", "process s"], rows))
    for i, r in enumerate(runs):
        print(f"run {i + 1}, engine init: " + ", ".join(f"{k} {v:.2f} s" for k, v in r["engine_phases_s"].items()))
    report.write_json(data, args.output_json)
    return 0
