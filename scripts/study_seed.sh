#!/usr/bin/env bash
# One seed of the pre-registered study (docs/study.md, "The study of 2026-11-27") on one
# machine in one 30-minute hold (4 GPUs planned; GPUS=N, default every visible GPU, spreads
# the runs round-robin): calibrate the six schedules, run the nine arms of
# sparrow/conf/study/study_<variant>.yaml at once for 100 steps, then per-step CSVs, the
# held-out outcome of every arm and summary.json under $OUT/<variant>-s<seed>/.
#
#   bash scripts/study_seed.sh v2 0          # the kept admitted model, models/testbed-v2-small
#   bash scripts/study_seed.sh v2 0 /path/to/tb-v2      # another (scripts/train_testbed_model.py)
#
# A model folder with training_info.json must hold the weights it names (sha256), else the
# script stops before any run; the seed folder records the model's sha256 (model.json).
# Time plan (docs/study.md, "GPU plan" and its fourth addendum): calibration about 2 min,
# the arms at most STUDY_MINUTES (default 21), outcome and CSVs about 2.5 min. An arm that has not finished
# by then is stopped (Ctrl-C: resumable, but its state does not outlive the machine) and
# reported with the steps it did. ARMS=a,b,... runs those arms of the YAML only (a seed split
# over holds, docs/study.md's third addendum), with only the schedules they need calibrated;
# SKIP_RULE_ARMS=1 drops the two selection-rule arms (for a tree without schedule.selection);
# CALIBRATE_ONLY=1 stops after the calibrations (scripts/distill_fair.sh takes its schedules);
# TOPK_GRID=[..] calibrates on another top-k grid, EXTRA_TARGETS="0.70 .." centroid at more targets.
# GPU_IDS=1,2,3 spreads over those GPUs instead of 0..GPUS-1, so that two seeds (their WORK and
# $OUT/<variant>-s<seed> differ) can run on disjoint GPUs of one machine.
# STUDY_FILE=path runs another study's YAML on the variant's data and model (docs/async.md's
# one-step-off check: sparrow/conf/study/study_v2_async.yaml), its folder <name>-s<seed>.
set -euo pipefail
VARIANT=${1:?variant: v2 or v3}
SEED=${2:?seed}
MODEL=${3:-models/testbed-$VARIANT-small}
OUT=${OUT:-/tmp/study-out}
case $VARIANT in
  v2|v3) ;;
  *) echo "variant must be v2 or v3" >&2; exit 2 ;;
esac
# the study's YAML: the variant's stability study, or STUDY_FILE (another study on its data)
STUDY=${STUDY_FILE:-sparrow/conf/study/study_$VARIANT.yaml}
[ -f "$STUDY" ] || { echo "no study file $STUDY (STUDY_FILE)" >&2; exit 2; }
NAME=$(basename "$STUDY" .yaml); NAME=${NAME#study_}  # study_v2.yaml: v2; study_v2_async.yaml: v2_async
WORK=${WORK:-/tmp/sw-$NAME-s$SEED}
ID=$NAME-s$SEED
STUDY_MINUTES=${STUDY_MINUTES:-21}
DEST=$OUT/$ID
mkdir -p "$DEST" "$WORK"
[ -d "$MODEL" ] || { echo "no model folder $MODEL (the third argument)" >&2; exit 2; }
MODEL=$(cd "$MODEL" && pwd)  # absolute: the arms run from other folders
# the weights are the ones training_info.json names, or nothing runs
python - "$MODEL" "$DEST/model.json" <<'PY'
import json, sys
from pathlib import Path
from sparrow.experiments.testbed.phases import StartError, kept_weights_sha256
record = {"model": sys.argv[1]}
if (Path(sys.argv[1]) / "training_info.json").exists():
    try:
        record["model_safetensors_sha256"] = kept_weights_sha256(sys.argv[1])
    except StartError as err:
        sys.exit(str(err))
Path(sys.argv[2]).write_text(json.dumps(record, indent=1) + "\n")
PY
# the task, the length and the rule arms' selection come from the study's YAML alone
read -r SPEC TOKENS RULE < <(python - "$STUDY" <<'PY'
import sys
from omegaconf import OmegaConf
data = OmegaConf.to_container(OmegaConf.load(sys.argv[1]))
common = dict(o.split("=", 1) for o in data["common"] if "=" in o)
rules = {o.split("=", 1)[1] for a in data["arms"] for o in a.get("overrides", [])
         if o.startswith("schedule.selection=")}
assert len(rules) <= 1, f"one selection rule for the rule arms, found {sorted(rules)}"
print(common["data.train"], common["rollout.max_new_tokens"], rules.pop() if rules else "centroid")
PY
)
if [ -n "${GPU_IDS:-}" ]; then  # these GPUs only: two seeds can share a machine on disjoint ones
  [[ "$GPU_IDS" =~ ^[0-9]+(,[0-9]+)*$ ]] || { echo "GPU_IDS must be GPU numbers like 1,2,3, got '$GPU_IDS'" >&2; exit 2; }
  IFS=, read -r -a IDS <<< "$GPU_IDS"
else
  GPUS=${GPUS:-$(nvidia-smi -L 2>/dev/null | wc -l)}
  [ "$GPUS" -ge 1 ] || { echo "no GPU visible (set GPUS=N)" >&2; exit 2; }
  IDS=($(seq 0 $((GPUS - 1))))
fi
gpu() { echo "${IDS[$(( $1 % ${#IDS[@]} ))]}"; }   # the i-th run's GPU, round-robin
# the arms this hold runs: every arm of the YAML, or ARMS's, less the rule arms if SKIP_RULE_ARMS=1
NARMS=$(python - "$STUDY" "$DEST/study.yaml" "${ARMS:-}" "${SKIP_RULE_ARMS:-0}" <<'PY'
import sys
from omegaconf import OmegaConf
data = OmegaConf.to_container(OmegaConf.load(sys.argv[1]))
names = [a["name"] for a in data["arms"]]
wanted = [n.strip() for n in sys.argv[3].split(",") if n.strip()] or names
unknown = sorted(set(wanted) - set(names))
if unknown:
    sys.exit(f"ARMS names {unknown}, not arms of {sys.argv[1]} ({', '.join(names)})")
data["arms"] = [a for a in data["arms"] if a["name"] in wanted]
if data.get("reference_arm", "dense") not in wanted:  # this hold leaves it out: none here
    data["reference_arm"] = ""
if sys.argv[4] == "1":
    data["arms"] = [a for a in data["arms"] if not any("schedule.selection" in o for o in a.get("overrides", []))]
OmegaConf.save(OmegaConf.create(data), sys.argv[2])
print(len(data["arms"]))
PY
)
STUDY=$DEST/study.yaml
# the hold's study file as `sparrow study run` will read it, checked before any GPU time is spent
python - "$STUDY" <<'PY' || exit 2
import sys
from sparrow.config import ConfigError
from sparrow.config.study import load_study
try:
    load_study(sys.argv[1])
except ConfigError as err:
    sys.exit(f"the hold's study file does not load: {err}")
PY
# the schedules those arms name, once each: NAME TARGET SELECTION
CALIBRATIONS=$(python - "$STUDY" <<'PY'
import sys
from omegaconf import OmegaConf
seen = {}
for arm in OmegaConf.to_container(OmegaConf.load(sys.argv[1]))["arms"]:
    o = dict(x.split("=", 1) for x in arm.get("overrides", []) if "=" in x)
    if "schedule.name" in o and "schedule.target" in o:
        seen.setdefault(o["schedule.name"], (o["schedule.target"], o.get("schedule.selection", "")))
for name, (target, selection) in seen.items():
    print(name, target, selection or "-")
PY
)
# EXTRA_TARGETS="0.70 0.60": centroid schedules at more targets (scripts/distill_fair.sh)
for target in ${EXTRA_TARGETS:-}; do
  CALIBRATIONS+=$'\n'"$VARIANT-centroid-$target $target -"
done
START=$(date +%s)
log() { echo "[$(( $(date +%s) - START ))s] $*" | tee -a "$DEST/timeline.txt"; }

# calibration: one schedule per target (and per rule), on the sparse actor's own samples
COMMON=(model=testbed "model.path=$MODEL" data=testbed rollout=testbed "data.train=$SPEC"
  "rollout.max_new_tokens=$TOKENS" "pipeline.workdir=$WORK" "pipeline.seed=$SEED"
  schedule.name=qwen3-1.7b-0.86 "calibrate.topk_pages=${TOPK_GRID:-[2,4,8,12,16,24,32,48,64,96,128,192]}")
calibrate() {  # GPU NAME TARGET [extra overrides]
  local gpu=$1 name=$2 target=$3; shift 3
  CUDA_VISIBLE_DEVICES=$gpu sparrow calibrate "${COMMON[@]}" schedule.target=$target \
    calibrate.name=$name "$@" >"$DEST/calibrate-$name.log" 2>&1
}
log "calibrating"
# all at once, round-robin over the GPUs (the pilot's two rounds of four and two took 170 s)
i=0
while read -r name target selection; do
  [ -n "$name" ] || continue
  extra=(); [ "$selection" = - ] || extra=("schedule.selection=$selection")
  calibrate "$(gpu $i)" "$name" "$target" "${extra[@]}" &
  i=$((i + 1))
done <<< "$CALIBRATIONS"
wait
log "calibrated"
sparrow query --workdir "$WORK" --csv "SELECT * FROM calibration ORDER BY ALL" >"$DEST/calibration.csv" || true
if [ "${CALIBRATE_ONLY:-0}" = 1 ]; then log "calibrate only: the schedules are under $WORK/schedules"; exit 0; fi

# the arms: one slot each, round-robin over the GPUs (nine on 4: 3 on GPU 0, 2 on each other), all at once
SLOTS=$(for ((i = 0; i < NARMS; i++)); do gpu $i; done | paste -sd,)
log "study $ID: up to $STUDY_MINUTES minutes on GPUs $SLOTS, rule arms $RULE"
timeout --signal=INT --kill-after=120 "${STUDY_MINUTES}m" \
  sparrow study run "$ID" --study "$STUDY" --gpus "$SLOTS" \
    model.path="$MODEL" pipeline.workdir="$WORK" pipeline.seed="$SEED" \
    >"$DEST/study.log" 2>&1 || log "study stopped (exit $?)"
log "study done"
cp "$WORK"/studies/"$ID"/arms/*.log "$DEST"/ 2>/dev/null || true
python scripts/study_outcome.py --workdir "$WORK" --study-id "$ID" --variant "$VARIANT" \
  --model "$MODEL" --out "$DEST" >"$DEST/outcome.log" 2>&1 || log "outcome failed"
sparrow study report "$ID" --workdir "$WORK" --out "$DEST/report" >/dev/null 2>&1 || true
log "all done"
