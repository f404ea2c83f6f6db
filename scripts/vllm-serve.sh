#!/usr/bin/env bash
# Serve a causal LM folder with vLLM's OpenAI-compatible server from .venv-vllm (make vllm builds it), as forkyard's
# vLLM sampler (trainer/vllm_sampler.py) needs it: log-probs after temperature, prefix caching on, float32 on a CPU.
#   ./scripts/vllm-serve.sh MODEL_DIR [PORT]      (PORT 8000 unless given; extra vLLM flags after it)
set -euo pipefail
cd "$(dirname "$0")/.."
model="${1:?usage: scripts/vllm-serve.sh MODEL_DIR [PORT] [vLLM flags...]}"
port="${2:-8000}"
shift $(( $# >= 2 ? 2 : 1 ))
test -x .venv-vllm/bin/python || { echo "no .venv-vllm: run make vllm first" >&2; exit 2; }
# KV cache size in GiB on a CPU (vLLM's default, 4, is more than a test machine's tiny models need)
export VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}"
# the development endpoints: the sampler's weight sync (reload_weights through /collective_rpc, /reset_prefix_cache);
# they run what they are asked, so the server listens on loopback only
export VLLM_SERVER_DEV_MODE=1
# No chunked prefill: vLLM 0.32 rewinds a seeded request's generator after a partial prefill, and a CPU generator
# cannot rewind ("CPU Generator does not use offset": the engine dies). Each prompt is prefilled whole (at most
# --max-num-batched-tokens tokens a step, at least --max-model-len).
# the model's own context, at most 2048 tokens (a later --max-model-len among the extra flags wins)
ctx="$(.venv-vllm/bin/python -c 'import json, sys; c = json.load(open(sys.argv[1] + "/config.json"))
print(min(int(c.get("max_position_embeddings") or 2048), 2048))' "$model")"
exec .venv-vllm/bin/python -m vllm.entrypoints.openai.api_server --model "$model" --host 127.0.0.1 --port "$port" \
  --dtype float32 --max-model-len "$ctx" --enable-prefix-caching --logprobs-mode processed_logprobs \
  --no-enable-chunked-prefill --max-num-batched-tokens 8192 "$@"
