#!/usr/bin/env python3
"""Captures the example CLI's stdout for every case of tests/fixtures/cli-golden/cases.json.

Usage: scripts/capture_cli_golden.py PATH/TO/gpt2_generate [OUT_DIR]

The integration test `cli::outputs_are_byte_identical_to_the_golden_runs` replays the same cases
through `burn_llm::cli::run_with` and compares stdout with these files, after masking what varies
between runs (timings, measured and predicted throughput). Re-capture only when an output change
is intended, and say why in the commit.
"""
import json
import os
import subprocess
import sys
import tempfile

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
golden = os.path.join(root, "tests", "fixtures", "cli-golden")
binary = sys.argv[1]
out_dir = sys.argv[2] if len(sys.argv) > 2 else golden
cases = json.load(open(os.path.join(golden, "cases.json")))
scratch = tempfile.mkdtemp(prefix="burn-llm-golden-")
for name, argv in cases.items():
    fixture, *rest = argv
    cmd = [binary, "--model", os.path.join(root, "tests", "fixtures", fixture), "--device", "flex", *rest]
    if "offload" in rest:
        cmd += ["--offload-dir", os.path.join(scratch, "tensors"), "--profile", os.path.join(scratch, "profile.json")]
    run = subprocess.run(cmd, capture_output=True, env={**os.environ, "BURN_LLM_TEST_WGPU": "0"})
    if run.returncode != 0:
        sys.exit(f"{name}: exit {run.returncode}\n{run.stderr.decode()}")
    with open(os.path.join(out_dir, f"{name}.out"), "wb") as f:
        f.write(run.stdout)
    print(f"{name}: {len(run.stdout)} bytes")
