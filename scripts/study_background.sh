#!/usr/bin/env bash
# Holds of scripts/study_seed.sh that outlive the shell that starts them, and their collection:
# for a machine whose commands are cut shorter than a hold (a 30-minute hold run through calls
# of at most 10 minutes), or two seeds' holds on disjoint GPUs of one machine at once.
#
#   bash scripts/study_background.sh start "v2 2 GPU_IDS=0 ARMS=dense,fixed,centroid-0.86" \
#                                          "v3 0 GPU_IDS=1 STUDY_MINUTES=22 ARMS=dense,fixed,centroid-0.86"
#   bash scripts/study_background.sh collect 540 DEST     # wait up to 540 s, then DEST/seed.tgz
#
# start: each argument is one hold, "VARIANT SEED [NAME=VALUE ...]" (the settings study_seed.sh
# reads: GPU_IDS, GPUS, ARMS, STUDY_MINUTES, ...); each runs in its own process session
# (setsid), so it survives the command that started it, with its seed folder under
# $STUDY_BG (default /tmp/study-bg), its process group in $STUDY_BG/<n>.pid and its exit
# status in $STUDY_BG/<n>.done once it ends.
# Two holds that would share a workdir or a seed folder are refused: two holds of one seed at
# once each name their own WORK=/tmp/... and OUT=$STUDY_BG/... (a folder under $STUDY_BG).
# collect: waits until every started hold has its .done or SECONDS pass, prints each seed
# folder's timeline and each arm's last log line, writes a host-load snapshot, and packs
# $STUDY_BG (what there is: a hold still running comes back partial) into DEST/seed.tgz.
# Prints "ALL DONE" when every hold has ended.
set -euo pipefail
BG=${STUDY_BG:-/tmp/study-bg}
SEED_SCRIPT=${STUDY_SEED_SCRIPT:-scripts/study_seed.sh}
usage() { sed -n '2,19p' "$0" >&2; exit 2; }
[ $# -ge 1 ] || usage
verb=$1; shift
case $verb in
  start)
    [ $# -ge 1 ] || usage
    [ -f "$SEED_SCRIPT" ] || { echo "no $SEED_SCRIPT here (run from the repository root)" >&2; exit 2; }
    seen=" "
    for job in "$@"; do  # every hold checked before any starts
      read -r variant seed _ <<< "$job"
      [[ "$variant" =~ ^v[0-9]+$ && "$seed" =~ ^[0-9]+$ ]] || {
        echo "a hold is \"VARIANT SEED [NAME=VALUE ...]\", got '$job'" >&2; exit 2; }
      work=/tmp/sw-$variant-s$seed out=$BG  # study_seed.sh's workdir, and where its folder goes
      for setting in $job; do
        [[ "$setting" == "$variant" || "$setting" == "$seed" || "$setting" =~ ^[A-Z_]+=.+$ ]] || {
          echo "'$setting' in hold '$job' is not NAME=VALUE" >&2; exit 2; }
        case $setting in WORK=*) work=${setting#WORK=} ;; OUT=*) out=${setting#OUT=} ;; esac
      done
      for place in "work:$work" "folder:$out/$variant-s$seed"; do
        [[ "$seen" != *" $place "* ]] || {
          echo "two holds at once would share one ${place%%:*} (${place#*:}): give one its own WORK= and OUT=" >&2
          exit 2; }
        seen+="$place "
      done
    done
    mkdir -p "$BG"
    n=$(find "$BG" -maxdepth 1 -name '*.driver.log' | wc -l)
    for job in "$@"; do
      n=$((n + 1))
      read -r variant seed settings <<< "$job"
      # shellcheck disable=SC2086  # settings are NAME=VALUE words for env
      setsid nohup env OUT="$BG" $settings bash -c \
        "bash '$SEED_SCRIPT' $variant $seed; echo \$? > '$BG/$n.done'" \
        >"$BG/$n.driver.log" 2>&1 </dev/null &
      echo $! >"$BG/$n.pid"  # its process group: kill -INT -- -PID stops the hold
      echo "hold $n: $variant seed $seed ${settings:-}"
    done
    ;;
  collect)
    [ $# -eq 2 ] || usage
    seconds=$1 dest=$2
    [[ "$seconds" =~ ^[0-9]+$ ]] || { echo "collect: SECONDS must be a whole number, got '$seconds'" >&2; exit 2; }
    [ -d "$BG" ] || { echo "collect: nothing started here ($BG is missing)" >&2; exit 2; }
    started=$(find "$BG" -maxdepth 1 -name '*.driver.log' | wc -l)
    end=$(( $(date +%s) + seconds ))
    ended() { find "$BG" -maxdepth 1 -name '*.done' | wc -l; }
    while [ "$(ended)" -lt "$started" ] && [ "$(date +%s)" -lt "$end" ]; do sleep 5; done
    mkdir -p "$dest"
    { date; uptime; top -bn1 | head -40; nvidia-smi 2>/dev/null || true; } \
      >"$dest/load-$(date +%H%M%S).txt" 2>&1
    find "$BG" -mindepth 2 -maxdepth 3 -name timeline.txt | sort | while read -r timeline; do
      echo "== ${timeline#"$BG"/}"; tail -5 "$timeline"
    done
    for log in /tmp/sw-*/studies/*/arms/*.log; do
      [ -f "$log" ] && echo "-- $log: $(tail -c 300 "$log" | tail -1)"
    done
    tar -C "$BG" -czf "$dest/seed.tgz" .
    echo "$(ended) of $started holds ended"
    [ "$(ended)" -lt "$started" ] || echo "ALL DONE"
    ;;
  *) usage ;;
esac
