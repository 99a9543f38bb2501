#!/usr/bin/env bash
# DistillSparse's fair test as docs/distill.md writes it down ("A fair test, written before it
# runs" and its addendum), on one GPU: the kept V2 testbed model; the schedules calibrated at
# 0.86 and at the cheaper target (0.75, else the first of 0.70, 0.60, 0.50 that is cheaper) by
# scripts/study_seed.sh itself (CALIBRATE_ONLY=1: the study's settings, task and length, a
# finer top-k grid); then per seed benchmarks/distill.py with the base fixed, the fixed set replayed
# before and after; a JSON per seed, summary.json (the verdicts) and distill_fair.png (+ .csv) under
# $OUT/distill-fair/.
#
#   bash scripts/distill_fair.sh                        # seeds 0 1 2, 40 steps
#   SEEDS=0 STEPS=5 bash scripts/distill_fair.sh        # a quick look (not the test)
#   SELECTOR=1.0 bash scripts/distill_fair.sh           # the selector run (docs/distill.md)
#
# About 2 minutes of calibration, then each seed's steps (MODEL, OUT, WORK, SEEDS, STEPS set
# the rest).
set -euo pipefail
MODEL=${MODEL:-models/testbed-v2-small}
SELECTOR=${SELECTOR:-0}  # algo.distill.selector_coef: 0 the fair test, 1.0 its selector run
OUT=${OUT:-/tmp/distill-out}/distill-fair$([ "$SELECTOR" = 0 ] || echo "-selector")
WORK=${WORK:-/tmp/sw-distill-fair}
SEEDS=${SEEDS:-0 1 2}
STEPS=${STEPS:-40}
PYTHON=${PYTHON:-python}
[ -d "$MODEL" ] || { echo "no model folder $MODEL (MODEL)" >&2; exit 2; }
MODEL=$(cd "$MODEL" && pwd)
mkdir -p "$OUT" "$WORK"
# the schedules, calibrated as the study's seed 0 calibrates its arms of them, on a grid with
# steps between 64 and 128 (docs/distill.md, the fair test's addendum: on the study's grid 0.75
# and 0.86 give the same schedule) and at the fallback targets
GRID=[2,4,8,12,16,24,32,48,64,80,96,104,112,120,128,192]
FALLBACK="0.70 0.60 0.50"
OUT="$OUT" WORK="$WORK" GPUS=1 ARMS=centroid-0.86,centroid-0.75 CALIBRATE_ONLY=1 \
  TOPK_GRID="$GRID" EXTRA_TARGETS="$FALLBACK" \
  bash scripts/study_seed.sh v2 0 "$MODEL" >"$OUT/calibrate.log" 2>&1 ||
  { echo "calibration failed (see $OUT/calibrate.log)" >&2; exit 3; }
# the task and length of the study's file, as the arms train on them
read -r TASK TOKENS < <(python - "$OUT/v2-s0/study.yaml" <<'PY'
import sys
from omegaconf import OmegaConf
common = dict(o.split("=", 1) for o in OmegaConf.load(sys.argv[1]).common if "=" in o)
print(common["data.train"], common["rollout.max_new_tokens"])
PY
)
schedule() {  # the newest version calibration wrote for target $1
  local found
  found=$(ls "$WORK"/schedules/v2-centroid-"$1"-v*.yaml 2>/dev/null | sort -V | tail -n 1)
  [ -n "$found" ] || { echo "calibration at $1 wrote no schedule (see $OUT/v2-s0/calibrate-v2-centroid-$1.log)" >&2; exit 3; }
  echo "$found"
}
CALIBRATED=$(schedule 0.86)
# the cheaper schedule: the first of 0.75 and the fallbacks that reads fewer pages than 0.86's
# (no bin's top-k above, one below); none: stop before any run
CHEAPER=
for target in 0.75 $FALLBACK; do
  candidate=$(schedule "$target")
  if python - "$CALIBRATED" "$candidate" <<'PY'
import sys
import yaml
top = [yaml.safe_load(open(path))["topk_pages"] for path in sys.argv[1:]]
sys.exit(0 if all(b <= a for a, b in zip(*top)) and top[1] != top[0] else 1)
PY
  then CHEAPER=$candidate; break; fi
done
[ -n "$CHEAPER" ] || { echo "no target of 0.75 $FALLBACK calibrated to a schedule cheaper than 0.86's ($CALIBRATED)" >&2; exit 3; }
echo "{\"cheaper\": \"$CHEAPER\", \"target\": $target}" > "$OUT/cheaper.json"
for seed in $SEEDS; do
  "$PYTHON" benchmarks/distill.py --model "$MODEL" --data "$TASK" --reward share_match \
    --calibrated "$CALIBRATED" --cheaper "$CHEAPER" --no-update --steps "$STEPS" \
    --prompts 8 --samples 4 --eval-prompts 16 --fixed-samples 4 --max-new-tokens "$TOKENS" \
    --loss full_kl --rank 8 --alpha 16 --lr 1e-5 --lr-scale 20 --selector-coef "$SELECTOR" --device cuda \
    --kv-cache-mib 4096 --speed-repeats 1 --resamples 1000 --seed "$seed" \
    --workdir "$WORK/distill-$seed" --out "$OUT/seed-$seed.json" >"$OUT/seed-$seed.log" 2>&1
done
"$PYTHON" scripts/distill_fair_summary.py "$OUT"/seed-*.json --out "$OUT/summary.json" \
  --plot "$OUT/distill_fair.png"
