#!/usr/bin/env bash
# Train the two pre-specified text-policy arms of docs/results/text_policy.md (section 0/1) on the given
# training seeds, two runs at a time with one thread each (the shared 2-core CPU):
#   traj: a group of 24 independent episodes per iteration (96 env calls), 150 iterations
#   tree: uniform fork turn, 6 bases x 6 branches (about 99 env calls per iteration), 150 iterations
#   tree_entropy (section 0a): fork at the highest-entropy turn (ARPO-style, entropy = max along the greedy
#     continuation), 6 bases x 6 branches, until 14,400 env calls are spent (what traj spends)
# Optional: DEADLINE=EPOCH_SECONDS starts no run after that time (runs already started finish and count);
# EVAL=1 evaluates each finished run (forkyard eval-lm --samples 1000 --exact) into OUT_DIR/eval.jsonl.
# The SFT checkpoint may be a forkyard .pt file or a Hugging Face folder (--arch llama); runs save alike.
# Usage (from the repository root): [ARMS="traj tree"] [DEADLINE=...] [EVAL=1] experiments/text_policy/seeds.sh \
#   OUT_DIR SFT_CHECKPOINT SEED...
set -euo pipefail
export DEADLINE=${DEADLINE:-} EVAL=${EVAL:-}
out=$1; ckpt=$2; shift 2
mkdir -p "$out"
common="--max-turns 4 --max-new-tokens 8 --eval-samples 128 --threads 1 --eval-every 25 --iterations 150 --checkpoint $ckpt"
arms=${ARMS:-traj tree}
for seed in "$@"; do
  for arm in $arms; do
    case $arm in
      traj) echo "traj $seed --estimator traj --group-size 24" ;;
      tree) echo "tree $seed --estimator tree --n-base 6 --branches 6" ;;
      tree_entropy) echo "tree_entropy $seed --estimator tree --n-base 6 --branches 6 --fork-selection entropy --fork-entropy greedy_max --iterations 1000 --max-env-calls 14400" ;;
      *) echo "unknown arm $arm" >&2; exit 2 ;;
    esac
  done
done | xargs -P 2 -L 1 bash -c '
  arm=$0; seed=$1; shift
  run='"$out"'/${arm}_seed$seed
  if [ -n "$DEADLINE" ] && [ "$(date +%s)" -ge "$DEADLINE" ]; then echo "not started $arm $seed (DEADLINE)"; exit 0; fi
  if ! .venv/bin/forkyard train-lm '"$common"' --seed "$seed" "$@" --run-dir $run > $run.log 2>&1; then
    echo "FAILED $arm $seed $(date +%T), see $run.log"; exit 1
  fi
  echo "done $arm $seed $(date +%T)"
  if [ -n "$EVAL" ]; then
    ckpt=$run/model.pt; [ -e $ckpt ] || ckpt=$run/model
    .venv/bin/forkyard eval-lm $ckpt --samples 1000 --exact --threads 1 2>> $run.log | grep "^{" >> '"$out"'/eval.jsonl
    echo "evaluated $arm $seed $(date +%T)"
  fi'
