"""``brisk bench``: the workloads of BENCHMARKS.md (docs/benchmarks.md says how to run them).

datasets (W1/W2/W3 token ids, fingerprints), configs (model shapes), backends (brisk and HF generate), throughput
(W1/W2), latency (W3), startup (W7), random_dataset + serve + serve_metrics (W5/W6 client), report (JSON, table).
"""
