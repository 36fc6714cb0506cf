#!/usr/bin/env python3
"""HF transformers' `generate` on the workload of a `cargo xtask bench generate` report, and the
ratio burn-llm / HF per batch size.

Reads the burn-llm report (`generate.json`, written by `bench generate` on a `synthetic:` model):
the model's HF config, batch sizes, prompt length and new tokens. Builds the same model with
random weights from that config (no download), on the GPU when there is one, in f16 by default
(the dtype of the burn-llm report when it names one), and times greedy `generate` with EOS
ignored the way the Rust benchmark does: prefill = time to the first generated token, decode =
the remaining `new_tokens - 1` steps (a streamer timestamps each step; its `.cpu()` copy is the
per-step synchronisation burn-llm's greedy loop also has). Writes JSON and Markdown with HF's
figures, burn-llm's and their ratio (> 1: burn-llm is faster).

    python3 scripts/hf_generate_bench.py --like bench-results/generate.json --out bench-results/hf-generate
"""

import argparse
import json
import platform
import sys
import time
from pathlib import Path

DTYPES = {"f16": "float16", "bf16": "bfloat16", "f32": "float32"}


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--like", required=True, type=Path, help="burn-llm's generate.json to reproduce")
    p.add_argument("--out", required=True, type=Path, help="output path without extension (.json and .md are written)")
    p.add_argument("--device", default=None, help="torch device (default: cuda when available, else cpu)")
    p.add_argument("--dtype", choices=sorted(DTYPES), default=None,
                   help="weights and compute dtype (default: the burn-llm report's, else f16 on GPU, f32 on CPU)")
    p.add_argument("--runs", type=int, default=1, help="timed runs per batch size; the fastest is kept")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


class StepClock:
    """A `generate` streamer that records when each step's tokens arrive: the first `put` is the
    prompt, each later one a generated token for the whole batch."""

    def __init__(self):
        self.times = []

    def put(self, value):
        value.cpu()
        self.times.append(time.perf_counter())

    def end(self):
        pass


def build_model(config_json, device, dtype):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = dict(config_json)
    model_type = fields.pop("model_type")
    config = AutoConfig.for_model(model_type, **fields)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, DTYPES[dtype]))
    model.eval()
    eos = fields.get("eos_token_id", 0)
    model.generation_config.pad_token_id = eos
    model.generation_config.eos_token_id = eos
    return model


def timed_generate(model, ids, new_tokens, device):
    import torch

    clock = StepClock()
    mask = torch.ones_like(ids)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, num_beams=1,
                             max_new_tokens=new_tokens, min_new_tokens=new_tokens, streamer=clock)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    end = time.perf_counter()
    generated = out.shape[1] - ids.shape[1]
    if generated != new_tokens or len(clock.times) < 2:
        raise RuntimeError(f"generate made {generated} tokens, {new_tokens} asked")
    first = clock.times[1]
    return first - start, end - first, generated - 1


def command_line(args):
    """This run's command, its paths relative to the report's folder (no machine's paths in a
    report that may be committed)."""
    import os

    base = args.out.parent
    parts = [Path(sys.argv[0]).name]
    for arg in sys.argv[1:]:
        parts.append(os.path.relpath(arg, base) if arg in (str(args.like), str(args.out)) else arg)
    return " ".join(parts)


def main():
    args = parse_args()
    like = json.loads(args.like.read_text())
    config = like.get("config")
    if config is None:
        sys.exit(f"{args.like} has no `config`: run `bench generate` on a synthetic:… model (random weights)")
    try:
        import torch
        import transformers
    except ImportError as e:
        sys.exit(f"HF comparison needs PyTorch and transformers ({e})")
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = args.dtype or like.get("dtype") or ("f16" if device.startswith("cuda") else "f32")
    if dtype not in DTYPES:
        sys.exit(f"unknown dtype {dtype!r} (from {args.like}): pass --dtype f16|bf16|f32")
    batch_sizes = like.get("batch_sizes") or [r["batch"] for r in like["results"]]
    prompt_len, new_tokens = like["prompt_len"], max(like["new_tokens"], 2)
    vocab = config["vocab_size"]

    model = build_model(config, device, dtype)
    gen = torch.Generator().manual_seed(args.seed)
    prompts = lambda n: torch.randint(3, vocab, (n, prompt_len), generator=gen).to(device)
    timed_generate(model, prompts(1), 2, device)  # warm-up: allocator, kernels, cuBLAS handles

    burn = {r["batch"]: r for r in like["results"]}
    rows = []
    for batch in batch_sizes:
        ids = prompts(batch)
        runs = [timed_generate(model, ids, new_tokens, device) for _ in range(max(args.runs, 1))]
        prefill_s, decode_s, steps = min(runs, key=lambda r: r[0] + r[1])
        row = {
            "batch": batch,
            "prefill_s": prefill_s,
            "decode_s": decode_s,
            "decode_steps": steps,
            "prefill_tokens_per_s": batch * prompt_len / prefill_s,
            "decode_tokens_per_s": batch * steps / decode_s,
        }
        ours = burn.get(batch)
        if ours:
            row["burn_prefill_tokens_per_s"] = ours["prefill_tokens_per_s"]
            row["burn_decode_tokens_per_s"] = ours["decode_tokens_per_s"]
            row["prefill_ratio"] = ours["prefill_tokens_per_s"] / row["prefill_tokens_per_s"]
            row["decode_ratio"] = ours["decode_tokens_per_s"] / row["decode_tokens_per_s"]
        print(f"batch {batch:>3}: HF prefill {row['prefill_tokens_per_s']:>10.1f} tokens/s, "
              f"decode {row['decode_tokens_per_s']:>9.1f} tokens/s", file=sys.stderr)
        rows.append(row)

    gpu = torch.cuda.get_device_name(0) if device.startswith("cuda") else platform.processor() or platform.machine()
    report = {
        "benchmark": "hf-generate",
        "command": command_line(args),
        "model": like.get("model"),
        "device": device,
        "device_name": gpu,
        "dtype": dtype,
        "burn_device": like.get("device"),
        "burn_dtype": like.get("dtype", "f32 (no --dtype in this build)"),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "prompt_len": prompt_len,
        "new_tokens": new_tokens,
        "unix_time": int(time.time()),
        "results": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
    md = [
        f"# burn-llm vs HF transformers `generate`: {like.get('model')}",
        "",
        f"- HF: transformers {transformers.__version__}, torch {torch.__version__}, {device} ({gpu}), {dtype}",
        f"- burn-llm: `{like.get('command')}` on {like.get('device')}, dtype {report['burn_dtype']}",
        f"- prompt {prompt_len} tokens, {new_tokens} new tokens, greedy, EOS ignored; ratio = burn-llm ÷ HF",
        "",
        "| batch | HF prefill tok/s | burn prefill tok/s | prefill ratio | HF decode tok/s | burn decode tok/s | decode ratio |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        cell = lambda k, f="{:.1f}": f.format(r[k]) if k in r else "–"
        md.append(f"| {r['batch']} | {cell('prefill_tokens_per_s')} | {cell('burn_prefill_tokens_per_s')} | "
                  f"{cell('prefill_ratio', '{:.2f}×')} | {cell('decode_tokens_per_s')} | "
                  f"{cell('burn_decode_tokens_per_s')} | {cell('decode_ratio', '{:.2f}×')} |")
    args.out.with_suffix(".md").write_text("\n".join(md) + "\n")
    print(f"wrote {args.out.with_suffix('.json')} and .md", file=sys.stderr)


if __name__ == "__main__":
    main()
