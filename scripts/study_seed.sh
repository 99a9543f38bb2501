#!/usr/bin/env bash
# One seed of the pre-registered study (docs/study.md, "The study of 2026-11-27") on one
# 4-GPU machine in one 30-minute hold: calibrate the six schedules, run the nine arms of
# sparrow/conf/study/study_<variant>.yaml at once for 100 steps, then per-step CSVs, the
# held-out outcome of every arm and summary.json under $OUT/<variant>-s<seed>/.
#
#   bash scripts/study_seed.sh v2 0 /path/to/tb-v2      # model: scripts/train_testbed_model.py
#
# Time plan (docs/study.md, "GPU plan"): calibration about 2.5 min, the arms at most
# STUDY_MINUTES (default 21), outcome and CSVs about 2 min. An arm that has not finished
# by then is stopped (Ctrl-C: resumable, but its state does not outlive the machine) and
# reported with the steps it did. SKIP_RULE_ARMS=1 drops the two selection-rule arms
# (for a tree without schedule.selection).
set -euo pipefail
VARIANT=${1:?variant: v2 or v3}
SEED=${2:?seed}
MODEL=${3:?the testbed model folder}
OUT=${OUT:-/tmp/study-out}
WORK=${WORK:-/tmp/sw-$VARIANT-s$SEED}
ID=$VARIANT-s$SEED
STUDY_MINUTES=${STUDY_MINUTES:-21}
DEST=$OUT/$ID
mkdir -p "$DEST" "$WORK"
case $VARIANT in
  v2) SPEC=builtin:multi_chase:num_defs=256,num_hops=64,chains=4,tags=0; TOKENS=2304 ;;
  v3) SPEC=builtin:multi_chase:num_defs=256,num_hops=64,chains=4,tags=1; TOKENS=2816 ;;
  *) echo "variant must be v2 or v3" >&2; exit 2 ;;
esac
STUDY=sparrow/conf/study/study_$VARIANT.yaml
if [ "${SKIP_RULE_ARMS:-0}" = 1 ]; then
  python - "$STUDY" "$DEST/study.yaml" <<'PY'
import sys
from omegaconf import OmegaConf
data = OmegaConf.to_container(OmegaConf.load(sys.argv[1]))
data["arms"] = [a for a in data["arms"] if not any("schedule.selection" in o for o in a.get("overrides", []))]
OmegaConf.save(OmegaConf.create(data), sys.argv[2])
PY
  STUDY=$DEST/study.yaml
fi
START=$(date +%s)
log() { echo "[$(( $(date +%s) - START ))s] $*" | tee -a "$DEST/timeline.txt"; }

# calibration: one schedule per target (and per rule), on the sparse actor's own samples
COMMON=(model=testbed "model.path=$MODEL" data=testbed rollout=testbed "data.train=$SPEC"
  "rollout.max_new_tokens=$TOKENS" "pipeline.workdir=$WORK" "pipeline.seed=$SEED"
  schedule.name=qwen3-1.7b-0.86 "calibrate.topk_pages=[2,4,8,12,16,24,32,48,64,96,128,192]")
calibrate() {  # GPU NAME TARGET [extra overrides]
  local gpu=$1 name=$2 target=$3; shift 3
  CUDA_VISIBLE_DEVICES=$gpu sparrow calibrate "${COMMON[@]}" schedule.target=$target \
    calibrate.name=$name "$@" >"$DEST/calibrate-$name.log" 2>&1
}
log "calibrating"
calibrate 0 $VARIANT-centroid-0.75 0.75 & calibrate 1 $VARIANT-centroid-0.82 0.82 &
calibrate 2 $VARIANT-centroid-0.86 0.86 & calibrate 3 $VARIANT-centroid-0.92 0.92 &
wait
if [ "${SKIP_RULE_ARMS:-0}" != 1 ]; then
  calibrate 0 $VARIANT-rule-0.86 0.86 schedule.selection=centroid_maxhead &
  calibrate 1 $VARIANT-rule-0.80 0.80 schedule.selection=centroid_maxhead &
  wait
fi
log "calibrated"
sparrow query --workdir "$WORK" --csv "SELECT * FROM calibration ORDER BY ALL" >"$DEST/calibration.csv" || true

# the arms: nine slots, 3 on GPU 0 and 2 on each other GPU, all at once
log "study $ID: up to $STUDY_MINUTES minutes"
timeout --signal=INT --kill-after=120 "${STUDY_MINUTES}m" \
  sparrow study run "$ID" --study "$STUDY" --gpus 0,1,2,3,0,1,2,3,0 \
    model.path="$MODEL" pipeline.workdir="$WORK" pipeline.seed="$SEED" \
    >"$DEST/study.log" 2>&1 || log "study stopped (exit $?)"
log "study done"
cp "$WORK"/studies/"$ID"/arms/*.log "$DEST"/ 2>/dev/null || true
python scripts/study_outcome.py --workdir "$WORK" --study-id "$ID" --variant "$VARIANT" \
  --model "$MODEL" --out "$DEST" >"$DEST/outcome.log" 2>&1 || log "outcome failed"
sparrow study report "$ID" --workdir "$WORK" --out "$DEST/report" >/dev/null 2>&1 || true
log "all done"
