#!/usr/bin/env bash
# finetune_threads.sh FINETUNE: the main job's first 10 steps (default schedule of 200 steps,
# stopped after 10) at 1, 2, 3 and 4 threads must write bit-identical checkpoints (model, AdamW
# moments, step). The baseline is cut down (32 probe passages, 10 probe steps, 8 test passages)
# so the four runs take about a minute; the fine-tuning steps are the default run's.
set -euo pipefail
FT=$1
DIR=$(mktemp -d)
trap 'rm -rf "$DIR"' EXIT
for t in 1 2 3 4; do
  "$FT" --threads "$t" --stop-after 10 --probe-train 32 --probe-steps 10 --test-limit 8 \
    --out "$DIR/t$t.safetensors" > "$DIR/t$t.log" 2>&1 || { cat "$DIR/t$t.log"; exit 1; }
  echo "$t threads: $(grep -E "^step +10/" "$DIR/t$t.log" || true)"
  if [ "$t" != 1 ] && ! cmp -s "$DIR/t1.safetensors" "$DIR/t$t.safetensors"; then
    echo "FAIL: the checkpoint after 10 steps at $t threads differs from the one at 1 thread"
    cmp "$DIR/t1.safetensors" "$DIR/t$t.safetensors" | head -1 || true
    exit 1
  fi
  if [ "$t" != 1 ]; then rm -f "$DIR/t$t.safetensors"; fi  # 270 MB each
done
echo "checkpoints after 10 steps bit-identical at 1, 2, 3 and 4 threads ($(stat -c %s "$DIR/t1.safetensors") bytes)"
