"""What every benchmark result carries (command, date, device, versions, commit), the JSON file, and the table."""

from __future__ import annotations

import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

SCHEMA_VERSION = 1


def brisk_commit() -> dict:
    """The checkout's commit and whether tracked files differ from it; ``$BRISK_COMMIT`` when there is no .git."""
    root = Path(__file__).resolve().parents[2]
    info: dict = {"commit": os.environ.get("BRISK_COMMIT") or None, "dirty": None}
    if info["commit"] or not (root / ".git").exists():
        return info
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        status = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return info
    if head.returncode == 0:
        info["commit"] = head.stdout.strip()
        info["dirty"] = bool(status.stdout.strip()) if status.returncode == 0 else None
    return info


def device_name(device: str | None = None) -> str:
    """The accelerator's name (``torch.cuda.get_device_name``) or "cpu"."""
    import torch

    if device is not None and not str(device).startswith("cuda") and device != "auto":
        return "cpu"
    if not torch.cuda.is_available():
        return "cpu"
    index = torch.device(device).index if device and str(device).startswith("cuda:") else 0
    return torch.cuda.get_device_name(index or 0)


def environment() -> dict:
    """Where and with what a result was measured (the device's name is the caller's: it knows the device)."""
    import numpy
    import torch
    import transformers

    import brisk

    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "transformers": transformers.__version__,
        "numpy": numpy.__version__,
        "brisk": getattr(brisk, "__version__", None),
        **{f"brisk_{k}": v for k, v in brisk_commit().items()},
        "cpu_count": os.cpu_count(),
    }


def command_line() -> str:
    argv = list(sys.argv)
    if argv and Path(argv[0]).name in ("brisk", "main.py", "__main__.py"):
        argv[0] = "brisk"
    return shlex.join(argv)


def args_dict(args) -> dict:
    return {k: v for k, v in sorted(vars(args).items()) if k != "func" and not k.startswith("_")}


def make_report(bench: str, args, config: dict, results: dict, env: dict, **extra) -> dict:
    return {
        "schema_version": SCHEMA_VERSION,
        "bench": bench,
        "command": command_line(),
        "args": args_dict(args),
        **env,
        "config": config,
        "results": results,
        **extra,
    }


def write_json(report: dict, path: str | None) -> None:
    if not path:
        return
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(f"wrote {out}")


def fmt(value, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        return f"{value:.{digits}f}" if abs(value) >= 100 else f"{value:.{digits + 1}f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def table(headers: list[str], rows: list[list]) -> str:
    cells = [headers] + [[fmt(c) if not isinstance(c, str) else c for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = []
    for n, row in enumerate(cells):
        lines.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))))
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def load_peer(path: str | None) -> dict | None:
    """vLLM's figures from another run (``--peer-json``; format in docs/benchmarks.md), or None."""
    if not path:
        return None
    data = json.loads(Path(path).read_text())
    return data if isinstance(data, dict) else None


PEER_MODEL = "llama-3.1-8b-shape"  # what the vLLM anchor measured (bf16, random weights)


def peer_caveat(model: str) -> str | None:
    if model == PEER_MODEL:
        return None
    return f"the peer figure is for {PEER_MODEL} (bf16); this run used {model}, so the ratio compares different models"


def peer_info(args, peer: dict | None, **figures) -> dict | None:
    """What a report says of the peer JSON (None without one): where it came from, and its ``figures``."""
    if peer is None:
        return None
    return {
        "caveat": peer_caveat(args.model),
        "path": args.peer_json,
        "engine": peer.get("engine"),
        "version": peer.get("vllm"),
        **figures,
    }


def print_results(data: dict, headers: list[str], row: Callable[[dict], list], peer_row: list | None) -> None:
    """A table of the backends' results (``row(result)`` after the backend's name; a failed backend's error
    instead), then ``peer_row`` under the peer's name when given, then the ratios and the peer's caveat."""
    rows = []
    for name, r in data["results"].items():
        rows.append([name, r["error"], *[""] * (len(headers) - 2)] if "error" in r else [name, *row(r)])
    peer = data.get("peer") or {}
    if peer_row is not None:
        rows.append([f"{peer.get('engine') or 'peer'} {peer.get('version') or ''} (peer json)".strip(), *peer_row])
    print(table(headers, rows))
    print_ratios(data)


def print_ratios(data: dict) -> None:
    """The report's ratios, then the peer's caveat (a different model), if any."""
    for key, value in data["ratios"].items():
        if value is not None:
            print(f"{key}: {value:.2f}x")
    caveat = (data.get("peer") or {}).get("caveat")
    if caveat:
        print(f"note: {caveat}")


def ratio(a, b) -> float | None:
    if a is None or b is None or not b:
        return None
    return round(a / b, 3)
