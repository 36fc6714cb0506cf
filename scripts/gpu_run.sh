#!/usr/bin/env bash
# burn-llm's GPU test suite and GPU benchmarks, run from the bundle `cargo xtask gpu-bundle` makes
# (this file is the bundle's run.sh; its source is scripts/gpu_run.sh).
#
#   run.sh [--device vulkan|wgpu] [--quick | --speed] [--phases tests,generate,paged,attention,matvec,dispatches,serve,offload]
#          [--models synthetic:opt-125m,...] [--batch-sizes 1,8,32,128] [--dtype f16|bf16|f32]
#          [--deadline SECONDS] [--out DIR] [--work DIR] [--python PYTHON]
#
# Unpacks payload.tar.xz into the work folder, installs the Vulkan loaders when the system has
# none (dpkg -x into / as root, else into the work folder), then runs each phase under a time
# limit and writes, under $OUT (default ./gpu-out): summary.md, summary.json, results.tar.gz
# (every report and log) and run.log. They are rewritten after every phase, so a run cut short
# still returns what it finished; steps that would pass --deadline (default 560 s, inside the
# device tool's 10 minutes; none with --quick) are cut short or skipped. --quick: tiny benchmark
# shapes (a check on a software Vulkan driver such as lavapipe); the test suite is the same.
# --speed: the GPU-speed set in one command of at most 9 minutes: kernel benches (matvec,
# dispatches, paged, attention), LLaMA-7B-shaped generate vs HF at batch 1, 8, 32, serve with OPT-1.3B's
# shape and FlexGen's OPT-30B offloading setting, each step capped so the whole fits.
set -uo pipefail

DEVICE=vulkan
QUICK=0
PHASES=""
SPEED=0
MODELS=""
BATCHES=""
DTYPE=""
DEADLINE=""
OUT_DIR="${OUT:-$PWD/gpu-out}"
WORK="${BURN_LLM_GPU_WORK:-${TMPDIR:-/tmp}/burn-llm-gpu}"
PYTHON="${PYTHON:-python3}"

usage() { sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case "$1" in
    --device) DEVICE="$2"; shift 2 ;;
    --quick) QUICK=1; shift ;;
    --speed) SPEED=1; shift ;;
    --phases) PHASES="$2"; shift 2 ;;
    --models) MODELS="$2"; shift 2 ;;
    --batch-sizes) BATCHES="$2"; shift 2 ;;
    --dtype) DTYPE="$2"; shift 2 ;;
    --deadline) DEADLINE="$2"; shift 2 ;;
    --out) OUT_DIR="$2"; shift 2 ;;
    --work) WORK="$2"; shift 2 ;;
    --python) PYTHON="$2"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "run.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
case "$DEVICE" in vulkan|wgpu) ;; *) echo "run.sh: --device must be vulkan or wgpu, not '$DEVICE'" >&2; exit 2 ;; esac

BUNDLE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
mkdir -p "$OUT_DIR" "$WORK"
OUT_DIR="$(cd "$OUT_DIR" && pwd)"
RES="$WORK/results"
rm -rf "$RES"; mkdir -p "$RES"
LOG="$OUT_DIR/run.log"
: > "$LOG"
say() { echo "[$(date -u +%H:%M:%S)] $*" | tee -a "$LOG" >&2; }

# Per-phase time limits in seconds: a whole run fits one 10-minute device command only with
# --quick or a subset of phases (see the README's GPU section for the split).
if [ "$QUICK" = 1 ]; then
  T_TESTS=1500; T_BENCH=600; DEADLINE="${DEADLINE:-86400}"
  MODELS="${MODELS:-synthetic:opt-125m}"; BATCHES="${BATCHES:-1,2}"; PROMPT=8; NEW=4
  SERVE_ARGS=(--requests 8 --scale 0.02 --kv-tokens 1024 --max-model-len 128)
  OFFLOAD_ARGS=(--prompt-len 8 --gen-len 3)
  PAGED_ARGS=(--seqs 2 --context 64 --heads 4 --kv-heads 4,2 --head-dim 32 --iters 2)
  MATVEC_ARGS=(--shapes 256x512,96x200 --rows 1,5 --iters 2)
  ATTENTION_ARGS=(--prompts 40 --heads 4 --kv-heads 4,2 --head-dim 32 --iters 2)
else
  T_TESTS=420; T_BENCH=540
  # --speed has its own defaults (below): only the full set runs every model and batch.
  if [ "$SPEED" = 0 ]; then
    DEADLINE="${DEADLINE:-560}"
    MODELS="${MODELS:-synthetic:opt-125m,synthetic:opt-1.3b,synthetic:llama-7b}"; BATCHES="${BATCHES:-1,8,32,128}"
  fi
  PROMPT=64; NEW=32
  SERVE_ARGS=()
  OFFLOAD_ARGS=()
  PAGED_ARGS=()
  MATVEC_ARGS=()
  ATTENTION_ARGS=()
fi
if [ "$SPEED" = 1 ] && [ "$QUICK" = 0 ]; then
  PHASES="${PHASES:-matvec,dispatches,paged,attention,generate,serve,offload}"
  MODELS="${MODELS:-synthetic:llama-7b}"; BATCHES="${BATCHES:-1,8,32}"; NEW=16; DEADLINE="${DEADLINE:-540}"
  SERVE_ARGS=(--model synthetic:opt-1.3b --requests 64 --max-model-len 1024 --kv-tokens 32768)
  # The issue's PagedAttention target: at >= 32 sequences, with and without grouped-query
  # attention (32 query heads over 32 and 8 KV heads); 64 x 2048 is the 1 GiB f16 case.
  PAGED_ARGS=(--seqs 32,64 --context 2048 --kv-heads 32,8 --iters 10)
  # Per-step caps (seconds), from the H200 run of 2026-11-28 (matvec 25 s, dispatches 8, paged 2,
  # HF 20 per model; attention, serve and offload were cut at 30, 80 and 108): about 700 in
  # all, so the deadline cuts the last steps short; `--phases` splits the set over two calls
  # (docs/gpu.md).
  T_MATVEC=45; T_DISPATCHES=30; T_PAGED=45; T_ATTENTION=90; T_GENERATE=130; T_HF=60; T_SERVE=150; T_OFFLOAD=150
fi
PHASES="${PHASES:-tests,generate,paged,attention,matvec,dispatches,serve,offload}"
T_TESTS="${BURN_LLM_GPU_TEST_TIMEOUT:-$T_TESTS}"
T_BENCH="${BURN_LLM_GPU_BENCH_TIMEOUT:-$T_BENCH}"
for t in T_MATVEC T_DISPATCHES T_PAGED T_ATTENTION T_GENERATE T_HF T_SERVE T_OFFLOAD; do
  [ -n "${!t:-}" ] || printf -v "$t" '%s' "$T_BENCH"
done

# ---- unpack ---------------------------------------------------------------------------------
STAMP="$WORK/.unpacked-$(cksum < "$BUNDLE/payload.tar.xz" | cut -d' ' -f1)"
if [ ! -f "$STAMP" ]; then
  say "unpacking $(du -h "$BUNDLE/payload.tar.xz" | cut -f1) into $WORK"
  rm -rf "$WORK/bin" "$WORK/debs" "$WORK/fixtures" "$WORK"/.unpacked-*
  tar -xJf "$BUNDLE/payload.tar.xz" -C "$WORK" || { say "unpacking failed"; exit 1; }
  touch "$STAMP"
fi
BIN="$WORK/bin"
XTASK="$BIN/xtask"

# ---- Vulkan loader and driver ---------------------------------------------------------------
if ldconfig -p 2>/dev/null | grep -q 'libvulkan\.so\.1'; then
  say "Vulkan loader present on the system"
elif [ "$(id -u)" = 0 ]; then
  say "installing the Vulkan/GL loaders into / (dpkg -x)"
  for f in "$WORK"/debs/*.deb; do dpkg -x "$f" /; done
  ldconfig
else
  say "not root: unpacking the loaders into $WORK/sysroot"
  for f in "$WORK"/debs/*.deb; do dpkg -x "$f" "$WORK/sysroot"; done
  export LD_LIBRARY_PATH="$WORK/sysroot/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
NV=/usr/local/nvidia/share
if [ -z "${VK_DRIVER_FILES:-}${VK_ICD_FILENAMES:-}" ] && [ -f "$NV/vulkan/icd.d/nvidia_icd.json" ]; then
  export VK_DRIVER_FILES="$NV/vulkan/icd.d/nvidia_icd.json"
  export __EGL_VENDOR_LIBRARY_FILENAMES="$NV/glvnd/egl_vendor.d/10_nvidia.json"
fi
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-/tmp}"
{
  echo "date: $(date -u +%FT%TZ)"; echo "host: $(uname -srm)"; echo "device flag: $DEVICE"; echo "quick: $QUICK"
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  echo "VK_DRIVER_FILES=${VK_DRIVER_FILES:-}"; echo "bundle:"; cat "$BUNDLE/MANIFEST.json" 2>/dev/null | head -8
} > "$RES/device.txt" 2>&1

# ---- results --------------------------------------------------------------------------------
STEPS="$RES/steps.tsv"   # phase, step, status, seconds, detail
: > "$STEPS"
record() { printf '%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "$5" >> "$STEPS"; }

# Writes summary.md/summary.json and results.tar.gz under $OUT (after every phase).
publish() {
  "$PYTHON" - "$RES" "$OUT_DIR" <<'PY' 2>>"$LOG" || summary_without_python
import json, sys
from pathlib import Path
res, out = Path(sys.argv[1]), Path(sys.argv[2])
steps = [l.split("\t") for l in (res / "steps.tsv").read_text().splitlines() if l]
rows = [dict(zip(["phase", "step", "status", "seconds", "detail"], s)) for s in steps]
tests = json.loads((res / "tests.json").read_text()) if (res / "tests.json").exists() else []
md = ["# burn-llm GPU run", "", "```", (res / "device.txt").read_text().strip(), "```", "",
      "| phase | step | status | s | detail |", "|---|---|---|---:|---|"]
md += [f"| {r['phase']} | {r['step']} | {r['status']} | {r['seconds']} | {r['detail']} |" for r in rows]
failed = [t for s in tests for t in s.get("failed_tests", [])]
if failed:
    md += ["", "Failed tests:", ""] + [f"- `{t}`" for t in failed]
# Each report's Markdown; for generate, the comparison with HF when there is one (it holds both).
for d in sorted(p for p in res.iterdir() if p.is_dir() and p.name != "tests"):
    reports = [d / "hf-generate.md"] if (d / "hf-generate.md").exists() else sorted(d.glob("*.md"))
    for f in reports:
        body = "\n".join(f.read_text().strip().splitlines()[1:]).strip()
        md += ["", f"## {d.name}/{f.name}", "", body]
(out / "summary.md").write_text("\n".join(md) + "\n")
(out / "summary.json").write_text(json.dumps({"steps": rows, "tests": tests}, indent=2) + "\n")
PY
  tar -czf "$OUT_DIR/results.tar.gz.tmp" -C "$WORK" results && mv "$OUT_DIR/results.tar.gz.tmp" "$OUT_DIR/results.tar.gz"
}
summary_without_python() {
  { echo "# burn-llm GPU run (no python: steps only)"; echo; cat "$RES/device.txt"; echo; cat "$STEPS"; } > "$OUT_DIR/summary.md"
}

# Runs "$@" under the time limit $1 (less if the deadline is nearer), logging to $2; sets
# STEP_STATUS and STEP_SECONDS.
timed() {
  local limit="$1" log="$2"; shift 2
  local start=$SECONDS rc left=$((DEADLINE - SECONDS - 15))
  [ "$left" -lt "$limit" ] && limit=$left
  if [ "$limit" -lt 10 ]; then
    STEP_STATUS="skipped (deadline)"; STEP_SECONDS=0; echo "skipped: --deadline reached" > "$log"; return
  fi
  timeout --kill-after=10 "$limit" "$@" > "$log" 2>&1; rc=$?
  STEP_SECONDS=$((SECONDS - start))
  case $rc in 0) STEP_STATUS=ok ;; 124|137) STEP_STATUS="timeout (${limit} s)" ;; *) STEP_STATUS="failed (exit $rc)" ;; esac
  tail -n 3 "$log" | sed 's/^/    /' | tee -a "$LOG" >&2
}

has_phase() { case ",$PHASES," in *",$1,"*) return 0 ;; esac; return 1; }

# The flag `--dtype` of `xtask bench $1`, when this build has it.
dtype_flag() {
  [ -n "$DTYPE" ] || return 0
  if "$XTASK" bench "$1" --help 2>/dev/null | grep -q -- '--dtype'; then echo "--dtype $DTYPE"
  else say "note: this build's 'bench $1' has no --dtype flag: it runs in its default dtype (f32)"; fi
}

# ---- phase: GPU test suite ------------------------------------------------------------------
# suite name | binary | libtest filter (what it checks)
SUITE=(
  "kernels|kernels-tests|"                                                             # every CubeCL kernel vs its Flex twin, on the device
  "hf-parity|burn-llm-tests|parity::"                                                  # logits within 1e-4 of HF and greedy identical, every fixture
  "paged-preemption|burn-llm-tests|paged::greedy_equals_plain_generation_with_and_without_preemption"
  "paged-phased|burn-llm-tests|paged::phased_schedule_greedy_equals_plain_generation"
  "offload-exact|burn-llm-tests|offload::greedy_equals_plain_generation_for_exact_policies"  # weights/KV on the host: real transfers
  "quantized|burn-llm-tests|quantized::"                                               # 4/8-bit weights through the fused kernels
)
if has_phase tests; then
  say "phase tests on $DEVICE (BURN_LLM_TEST_DEVICE=$DEVICE), ${T_TESTS} s per suite"
  mkdir -p "$RES/tests"
  for entry in "${SUITE[@]}"; do
    IFS='|' read -r name binary filter <<< "$entry"
    say "  $name: $binary $filter"
    BURN_LLM_TEST_DEVICE="$DEVICE" BURN_LLM_FIXTURES="$WORK/fixtures" \
      timed "$T_TESTS" "$RES/tests/$name.log" "$BIN/$binary" $filter
    counts="$(grep -Eo 'test result: .*' "$RES/tests/$name.log" | tail -1)"
    if [ -z "$counts" ] && [ "$STEP_STATUS" != ok ] && [ "${STEP_STATUS#timeout}" = "$STEP_STATUS" ]; then
      # The binary died (a signal, e.g. a driver crash) and took its other tests with it: run each
      # test in its own process to tell which crash.
      say "  $name died ($STEP_STATUS): running its tests one by one"
      crashed=0; total=0; seconds=$STEP_SECONDS
      for t in $("$BIN/$binary" $filter --list 2>/dev/null | sed -n 's/: test$//p'); do
        total=$((total + 1))
        BURN_LLM_TEST_DEVICE="$DEVICE" BURN_LLM_FIXTURES="$WORK/fixtures" \
          timed "$T_TESTS" "$RES/tests/$name.one.log" "$BIN/$binary" --exact "$t"
        cat "$RES/tests/$name.one.log" >> "$RES/tests/$name.log"
        if [ "$STEP_STATUS" != ok ] && ! grep -q "^test $t \.\.\. FAILED" "$RES/tests/$name.one.log"; then
          printf '\ntest %s ... FAILED (%s)\n' "$t" "$STEP_STATUS" >> "$RES/tests/$name.log"
        fi
        [ "$STEP_STATUS" = ok ] || crashed=$((crashed + 1))
        seconds=$((seconds + STEP_SECONDS))
      done
      rm -f "$RES/tests/$name.one.log"
      STEP_STATUS="failed"; STEP_SECONDS=$seconds; counts="one by one: $((total - crashed)) of $total passed"
    fi
    record tests "$name" "$STEP_STATUS" "$STEP_SECONDS" "${counts:-no test result line}"
  done
  "$PYTHON" - "$RES" <<'PY' 2>>"$LOG"
import json, re, sys
from pathlib import Path
res = Path(sys.argv[1])
out = []
for step in (res / "steps.tsv").read_text().splitlines():
    phase, name, status, seconds, detail = step.split("\t")
    if phase != "tests":
        continue
    log = (res / "tests" / f"{name}.log").read_text(errors="replace")
    results = re.findall(r"^test (\S+) \.\.\. (ok|FAILED|ignored)", log, re.M)
    out.append({"suite": name, "status": status, "seconds": int(seconds), "summary": detail,
                "passed": [t for t, r in results if r == "ok"],
                "failed_tests": [t for t, r in results if r == "FAILED"],
                "log": f"tests/{name}.log"})
(res / "tests.json").write_text(json.dumps(out, indent=2) + "\n")
PY
  publish
fi

# ---- phase: generate throughput, burn-llm vs HF transformers --------------------------------
if has_phase generate; then
  say "phase generate on $DEVICE: models $MODELS, batches $BATCHES, prompt $PROMPT, new $NEW"
  if "$PYTHON" -c 'import torch, transformers' 2>/dev/null; then HF=1
  else HF=0; say "note: $PYTHON has no torch/transformers: the HF comparison is skipped"; fi
  IFS=',' read -r -a model_list <<< "$MODELS"
  for model in "${model_list[@]}"; do
    slug="generate-${model#synthetic:}"
    dir="$RES/$slug"; mkdir -p "$dir"
    # shellcheck disable=SC2046
    timed "$T_GENERATE" "$dir/burn.log" "$XTASK" bench generate --device "$DEVICE" --model "$model" \
      --batch-sizes "$BATCHES" --prompt-len "$PROMPT" --new-tokens "$NEW" --out "$dir" $(dtype_flag generate)
    record generate "$model burn-llm" "$STEP_STATUS" "$STEP_SECONDS" "$slug/generate.md"
    if [ "$HF" = 1 ] && [ -f "$dir/generate.json" ]; then
      hf_dtype=(); [ -n "$DTYPE" ] && hf_dtype=(--dtype "$DTYPE")
      timed "$T_HF" "$dir/hf.log" "$PYTHON" "$WORK/hf_generate_bench.py" --like "$dir/generate.json" \
        --out "$dir/hf-generate" "${hf_dtype[@]}"
      record generate "$model HF" "$STEP_STATUS" "$STEP_SECONDS" "$slug/hf-generate.md (ratios)"
    fi
    publish
  done
fi

# ---- phase: PagedAttention kernel bandwidth ---------------------------------------------------
if has_phase paged; then
  say "phase paged (PagedAttention bandwidth) on $DEVICE"
  mkdir -p "$RES/paged"
  # The nominal HBM bandwidth of the GPUs the device tool lends, for the fraction-of-peak column.
  peak=()
  case "$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)" in
    *H200*) peak=(--peak-gb-s 4800) ;;
    *H100*PCIe*) peak=(--peak-gb-s 2000) ;;
    *H100*NVL*) peak=(--peak-gb-s 3900) ;;
    *H100*) peak=(--peak-gb-s 3350) ;;
  esac
  # shellcheck disable=SC2046
  timed "$T_PAGED" "$RES/paged/paged.log" "$XTASK" bench paged-attention --device "$DEVICE" --out "$RES/paged" \
    "${PAGED_ARGS[@]}" "${peak[@]}" $(dtype_flag paged-attention)
  record paged "PagedAttention bandwidth" "$STEP_STATUS" "$STEP_SECONDS" "paged/paged-attention.md"
  publish
fi

# ---- phase: prefill attention, flash kernel vs the matmul path ------------------------------
if has_phase attention; then
  say "phase attention (prefill: flash kernel vs matmul path) on $DEVICE"
  mkdir -p "$RES/attention"
  # shellcheck disable=SC2046
  timed "$T_ATTENTION" "$RES/attention/attention.log" "$XTASK" bench attention --device "$DEVICE" \
    --out "$RES/attention" "${ATTENTION_ARGS[@]}" $(dtype_flag attention)
  record attention "flash vs matmul prefill" "$STEP_STATUS" "$STEP_SECONDS" "attention/attention.md"
  publish
fi

# ---- phase: decode matrix-vector kernels vs Burn's matmul and the per-output quantized kernel --
if has_phase matvec; then
  say "phase matvec (decode matrix-vector kernels, GB/s of weights) on $DEVICE"
  mkdir -p "$RES/matvec"
  # shellcheck disable=SC2046
  timed "$T_MATVEC" "$RES/matvec/matvec.log" "$XTASK" bench matvec --device "$DEVICE" --out "$RES/matvec" \
    "${MATVEC_ARGS[@]}" $(dtype_flag matvec)
  record matvec "matrix-vector kernels" "$STEP_STATUS" "$STEP_SECONDS" "matvec/matvec.md"
  publish
fi

# ---- phase: kernel launches per decode step ----------------------------------------------------
if has_phase dispatches; then
  say "phase dispatches (kernel launches per decode layer) on $DEVICE"
  mkdir -p "$RES/dispatches"
  # shellcheck disable=SC2046
  timed "$T_DISPATCHES" "$RES/dispatches/dispatches.log" "$XTASK" bench dispatches --device "$DEVICE" \
    --out "$RES/dispatches" $(dtype_flag dispatches)
  record dispatches "launches per decode layer" "$STEP_STATUS" "$STEP_SECONDS" "dispatches/dispatches.md"
  publish
fi

# ---- phase: serving, paged vs static batching -----------------------------------------------
if has_phase serve; then
  say "phase serve on $DEVICE"
  mkdir -p "$RES/serve"
  # shellcheck disable=SC2046
  timed "$T_SERVE" "$RES/serve/serve.log" "$XTASK" bench serve --device "$DEVICE" --out "$RES/serve" \
    "${SERVE_ARGS[@]}" $(dtype_flag serve)
  record serve "paged vs static" "$STEP_STATUS" "$STEP_SECONDS" "serve/serve.md"
  publish
fi

# ---- phase: offloading ------------------------------------------------------------------------
if has_phase offload; then
  say "phase offload on $DEVICE"
  mkdir -p "$RES/offload"
  help="$("$XTASK" bench offload --help 2>/dev/null)"
  extra=()
  if [ "$QUICK" = 0 ]; then
    if grep -q -- '--model' <<< "$help" && grep -q -- '--gpu-mem ' <<< "$help"; then
      # FlexGen's setting: OPT-30B (60 GB of f16 weights) under a 16 GiB device budget, the
      # weights held by host memory; the searched policy against both baselines, back to back.
      extra=(--model synthetic:opt-30b --gpu-mem 16GiB --cpu-mem 100GiB --prompt-len 512 --gen-len 8
        --policies searched,deepspeed,accelerate)
    else
      say "note: this build's 'bench offload' has no --model/--gpu-mem: it runs its built-in OPT model under its default budget, not OPT-30B under 16 GiB"
    fi
  fi
  # shellcheck disable=SC2046
  timed "$T_OFFLOAD" "$RES/offload/offload.log" "$XTASK" bench offload --device "$DEVICE" --out "$RES/offload" \
    --offload-dir "$WORK/offload-tier" "${OFFLOAD_ARGS[@]}" "${extra[@]}" $(dtype_flag offload)
  rm -rf "$WORK/offload-tier"
  record offload "searched vs DeepSpeed vs Accelerate" "$STEP_STATUS" "$STEP_SECONDS" "offload/offload.md"
  publish
fi

publish
say "done: $OUT_DIR/summary.md"
if grep -qv $'\tok\t' "$STEPS"; then exit 1; fi
