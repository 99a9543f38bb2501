#!/usr/bin/env bash
# DistillSparse's fair test as docs/distill.md writes it down ("A fair test, written before it
# runs"), on one GPU: the kept V2 testbed model; the schedules calibrated at 0.86 and at the
# cheaper target 0.75 on the sparse actor's own samples (as scripts/study_seed.sh calibrates
# them); then per seed benchmarks/distill.py with the base fixed, the fixed set replayed
# before and after; a JSON per seed and summary.json (the verdicts) under $OUT/distill-fair/.
#
#   bash scripts/distill_fair.sh                        # seeds 0 1 2, 40 steps
#   SEEDS=0 STEPS=5 bash scripts/distill_fair.sh        # a quick look (not the test)
#
# About 2 minutes of calibration, then each seed's steps (MODEL, OUT, WORK, SEEDS, STEPS set
# the rest).
set -euo pipefail
MODEL=${MODEL:-models/testbed-v2-small}
OUT=${OUT:-/tmp/distill-out}/distill-fair
WORK=${WORK:-/tmp/sw-distill-fair}
SEEDS=${SEEDS:-0 1 2}
STEPS=${STEPS:-40}
PYTHON=${PYTHON:-python}
TASK=builtin:multi_chase:num_defs=256,num_hops=63,chains=4,tags=0  # study_v2.yaml's
TOKENS=2304
[ -d "$MODEL" ] || { echo "no model folder $MODEL (MODEL)" >&2; exit 2; }
MODEL=$(cd "$MODEL" && pwd)
mkdir -p "$OUT" "$WORK"
COMMON=(model=testbed "model.path=$MODEL" data=testbed rollout=testbed "data.train=$TASK"
  "rollout.max_new_tokens=$TOKENS" "pipeline.workdir=$WORK" pipeline.seed=0
  schedule.name=qwen3-1.7b-0.86 "calibrate.topk_pages=[2,4,8,12,16,24,32,48,64,96,128,192]")
for target in 0.86 0.75; do
  sparrow calibrate "${COMMON[@]}" schedule.target=$target calibrate.name=v2-centroid-$target \
    >"$OUT/calibrate-$target.log" 2>&1 &
done
wait
schedule() {  # the newest version calibration wrote for target $1
  local found
  found=$(ls "$WORK"/schedules/v2-centroid-"$1"-v*.yaml 2>/dev/null | sort -V | tail -n 1)
  [ -n "$found" ] || { echo "calibration at $1 wrote no schedule (see $OUT/calibrate-$1.log)" >&2; exit 3; }
  echo "$found"
}
CALIBRATED=$(schedule 0.86)
CHEAPER=$(schedule 0.75)
for seed in $SEEDS; do
  "$PYTHON" benchmarks/distill.py --model "$MODEL" --data "$TASK" --reward share_match \
    --calibrated "$CALIBRATED" --cheaper "$CHEAPER" --no-update --steps "$STEPS" \
    --prompts 8 --samples 4 --eval-prompts 16 --fixed-samples 4 --max-new-tokens $TOKENS \
    --loss full_kl --rank 8 --alpha 16 --lr 1e-5 --lr-scale 20 --device cuda \
    --kv-cache-mib 4096 --speed-repeats 1 --resamples 1000 --seed "$seed" \
    --workdir "$WORK/distill-$seed" --out "$OUT/seed-$seed.json" >"$OUT/seed-$seed.log" 2>&1
done
"$PYTHON" scripts/distill_fair_summary.py "$OUT"/seed-*.json --out "$OUT/summary.json"
