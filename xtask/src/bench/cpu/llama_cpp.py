# Driver for `cargo xtask bench cpu`: llama.cpp (through llama-cpp-python's low-level bindings)
# greedy generation with the same thread count and token ids as burn-llm.
#
# argv[1]: JSON {"model", "threads", "n_ctx", "n_batch", "max_seqs"}. Prints one JSON line with
# the versions, then answers each JSON line {"prompts": [[ids]], "new_tokens": N} on stdin with
# {"prefill_s", "decode_s", "decode_steps", "ids"}: the prompts decode as one batch (sequence i
# = prompt i), then every step decodes one token per sequence. Timings as burn-llm's `Timing`:
# prefill up to the first sampled token, decode for every later step. With "flash_attn": false
# the request runs on a second context whose flash attention is off (llama.cpp's default is
# "auto", on for this CPU): the same model with another attention arithmetic. A line
# {"score": [[ids]], "candidates": [[ids]]} is answered with {"logprobs": [[f64]]}: for each
# context alone, the log-probabilities of its candidate next tokens. A line {"nll": [[ids]]}
# (`eval ppl --against llama.cpp`) is answered with {"nll": [[sum, count]]}: for each window
# alone, the summed next-token negative log-likelihood of its tokens after the first.
import ctypes
import json
import sys
import time

import numpy as np
import llama_cpp as L

cfg = json.loads(sys.argv[1])


@L.llama_log_callback
def _quiet(level, text, user_data):
    pass


L.llama_log_set(_quiet, ctypes.c_void_p(0))
L.llama_backend_init()
model_params = L.llama_model_default_params()
# llama-cpp-python 0.3.36's extra buffer types (the AMX repack path) segfault on Sapphire Rapids
# hosts, on Gemma 3 and SmolLM2 alike: weights stay in llama.cpp's plain CPU buffers.
model_params.use_extra_bufts = False
model = L.llama_model_load_from_file(cfg["model"].encode(), model_params)
if not model:
    sys.exit(f"llama.cpp could not load {cfg['model']}")
n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
params = L.llama_context_default_params()
params.n_ctx = cfg["n_ctx"]
params.n_batch = params.n_ubatch = cfg["n_batch"]
params.n_seq_max = cfg["max_seqs"]
params.n_threads = params.n_threads_batch = cfg["threads"]
params.kv_unified = True
params.no_perf = True
contexts = {}
for flash in (True, False):
    if not flash:
        params.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_DISABLED
    contexts[flash] = L.llama_init_from_model(model, params)
    if not contexts[flash]:
        sys.exit("llama.cpp could not create a context")
batch = L.llama_batch_init(cfg["n_batch"], 0, 1)
print(json.dumps({"version": L.__version__, "system_info": L.llama_print_system_info().decode().strip()}), flush=True)


def decode(entries):
    """entries: (token, position, sequence, wants logits)."""
    if len(entries) > cfg["n_batch"]:
        sys.exit(f"{len(entries)} tokens in one batch, more than n_batch = {cfg['n_batch']}")
    batch.n_tokens = len(entries)
    for k, (token, pos, seq, logits) in enumerate(entries):
        batch.token[k] = token
        batch.pos[k] = pos
        batch.n_seq_id[k] = 1
        batch.seq_id[k][0] = seq
        batch.logits[k] = 1 if logits else 0
    if L.llama_decode(ctx, batch) != 0:
        sys.exit("llama_decode failed")


def use_context(flash):
    """Makes `decode`, `argmax` and `score` run on the context with flash attention `flash`."""
    global ctx, memory
    ctx = contexts[flash]
    memory = L.llama_get_memory(ctx)


use_context(True)


def argmax(k):
    return int(np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, k), shape=(n_vocab,)).argmax())


def score(prefixes, candidates):
    """With the default context (flash attention as llama.cpp chooses)."""
    use_context(True)
    out = []
    for context, tokens in zip(prefixes, candidates):
        L.llama_memory_clear(memory, True)
        decode([(t, p, 0, p == len(context) - 1) for p, t in enumerate(context)])
        logits = np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, len(context) - 1), shape=(n_vocab,))
        logits = logits.astype(np.float64)
        top = logits.max()
        log_sum = top + np.log(np.exp(logits - top).sum())
        out.append([float(logits[t] - log_sum) for t in tokens])
    return out


def nll(windows):
    """For each window alone, with the default context: the sum over its tokens after the first of
    -log p(token | the tokens before it), in float64, and how many tokens that is."""
    use_context(True)
    out = []
    for window in windows:
        L.llama_memory_clear(memory, True)
        decode([(t, p, 0, True) for p, t in enumerate(window)])
        logits = np.ctypeslib.as_array(L.llama_get_logits(ctx), shape=(len(window), n_vocab))
        total = 0.0
        # Rows of a 262k vocabulary in float64 a few at a time.
        for start in range(0, len(window) - 1, 32):
            rows = logits[start : min(start + 32, len(window) - 1)].astype(np.float64)
            top = rows.max(axis=1)
            log_sum = top + np.log(np.exp(rows - top[:, None]).sum(axis=1))
            targets = np.asarray(window[start + 1 : start + 1 + len(rows)])
            total += float((log_sum - rows[np.arange(len(rows)), targets]).sum())
        out.append([total, len(window) - 1])
    return out


for line in sys.stdin:
    request = json.loads(line)
    if "score" in request:
        print(json.dumps({"logprobs": score(request["score"], request["candidates"])}), flush=True)
        continue
    if "nll" in request:
        print(json.dumps({"nll": nll(request["nll"])}), flush=True)
        continue
    prompts, new_tokens = request["prompts"], request["new_tokens"]
    use_context(request.get("flash_attn", True))
    L.llama_memory_clear(memory, True)
    entries = [(t, p, s, p == len(pr) - 1) for s, pr in enumerate(prompts) for p, t in enumerate(pr)]
    last = [k for k, e in enumerate(entries) if e[3]]
    start = time.perf_counter()
    decode(entries)
    ids = [[argmax(k)] for k in last]
    prefill_s = time.perf_counter() - start
    start = time.perf_counter()
    for step in range(1, new_tokens):
        decode([(ids[s][-1], len(prompts[s]) + step - 1, s, True) for s in range(len(prompts))])
        for s in range(len(prompts)):
            ids[s].append(argmax(s))
    decode_s = time.perf_counter() - start
    reply = {"prefill_s": prefill_s, "decode_s": decode_s, "decode_steps": new_tokens - 1, "ids": ids}
    print(json.dumps(reply), flush=True)
