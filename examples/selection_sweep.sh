#!/usr/bin/env bash
# Inference-time set selection against the decoders that exist (docs/decoding.md, "Choosing a set"):
# for K = 5 and 10 captions per test image of the XE, SCST and R-DPP m=5 models, random sampling,
# beam search (K beams), diverse beam search (K groups), and --select logprob / mbr / dpp (consensus
# and logprob quality) from C = 50 random samples; the temperature curves of the XE and SCST models
# (10 samples per image); the R-DPP points m = 2, 3, 5, 7 (10 random samples). Every step is an rdpp
# command and is skipped when its artifact is complete; then selection_tables.py prints the tables,
# the frontier comparison and writes the plot.
#
#   WS=runs-sweep bash examples/selection_sweep.sh        # after examples/toy_sweep.sh (or rdpp demo)
#   WS=/tmp/ws MAX_IMAGES=40 C=20 bash examples/selection_sweep.sh   # a small check
#
# Models are found in $WS by name (toy_sweep.sh's xe/xe, finetune/scst, finetune/dpp-m5; or rdpp
# demo's newest xe/*, finetune/scst-v*, finetune/dpp-m5-v*), or given: XE=... SCST=... DPP_M5=...
set -euo pipefail
WS=${WS:-runs-sweep}
RDPP=${RDPP:-rdpp}
PY=${PY:-python3}
C=${C:-50}                      # candidates per image for --select
KS=${KS:-"5 10"}                # set sizes of the table
TEMPS=${TEMPS:-"0.2 0.3 0.4 0.5 0.7 0.85 1.0 1.25 1.5 2.0"}  # the temperature curves (10 samples per image; an RL model needs T < 0.5 to reach low self-CIDEr)
SEED=${SEED:-0}
SPLIT=${SPLIT:-test}
DEVICE=${DEVICE:-cpu}
MAX_IMAGES=${MAX_IMAGES:-}
export RDPP_NO_PROGRESS=${RDPP_NO_PROGRESS:-1}
done_() { [ -f "$1/manifest.json" ]; }

pick() {  # group, name: $WS/group/name, else the newest complete $WS/group/name-v<k>
  local d=$WS/$1/$2
  if done_ "$d"; then echo "$d"; return; fi
  for d in $(ls -d "$WS/$1/$2"-v[0-9]* 2>/dev/null | sort -V -r); do
    if done_ "$d"; then echo "$d"; return; fi
  done
}
newest() { ls -d "$WS/$1"/*/ 2>/dev/null | while read -r d; do done_ "$d" && echo "${d%/}"; done | tail -1; }

XE=${XE:-$(pick xe xe)}
XE=${XE:-$(newest xe)}
SCST=${SCST:-$(pick finetune scst)}
declare -A MODEL=([xe]=$XE [scst]=$SCST)
for m in 2 3 5 7; do
  var=DPP_M$m
  MODEL[dpp-m$m]=${!var:-$(pick finetune "dpp-m$m")}
done
for label in xe scst dpp-m5; do
  [ -n "${MODEL[$label]}" ] || { echo "no $label model in $WS (give it as ${label^^}=PATH, e.g. DPP_M5=...)" >&2; exit 2; }
done

common=(--workspace "$WS" --device "$DEVICE" --split "$SPLIT" --seed "$SEED")
[ -n "$MAX_IMAGES" ] && common+=(--max-images "$MAX_IMAGES")

run() {  # model label, tag, then the sampling options: sample and score as sel-<label>-<tag>
  local label=$1 tag=$2; shift 2
  local name="sel-$label-$tag"
  done_ "$WS/samples/$name" || $RDPP sample "${MODEL[$label]}" "${common[@]}" "$@" --out "$WS/samples/$name"
  done_ "$WS/scores/$name" || $RDPP score "$WS/samples/$name" --workspace "$WS" --metrics CIDEr \
    --oracle --self-cider --diversity --out "$WS/scores/$name"
}

for label in xe scst dpp-m5; do
  for K in $KS; do
    run "$label" "random-k$K" --method random --n "$K"
    run "$label" "beam-k$K" --method beam --n "$K"
    run "$label" "dbs-k$K" --method dbs --n "$K"
    run "$label" "logprob-c$C-k$K" --n "$K" --select logprob --candidates "$C"
    run "$label" "mbr-c$C-k$K" --n "$K" --select mbr --candidates "$C"
    run "$label" "dpp-consensus-c$C-k$K" --n "$K" --select dpp --quality consensus --candidates "$C"
    run "$label" "dpp-logprob-c$C-k$K" --n "$K" --select dpp --quality logprob --candidates "$C"
  done
done
for label in xe scst; do  # the temperature curves; T = 1 is the random-k10 point above
  for T in $TEMPS; do
    if awk "BEGIN { exit !($T == 1) }"; then run "$label" "random-k10" --method random --n 10; continue; fi
    run "$label" "random-k10-t$T" --method random --n 10 --temperature "$T"
  done
done
for m in 2 3 5 7; do  # the R-DPP points
  if [ -n "${MODEL[dpp-m$m]}" ]; then run "dpp-m$m" "random-k10" --method random --n 10
  else echo "note: no R-DPP m=$m model in $WS (DPP_M$m=PATH); its point is left out" >&2; fi
done

$PY "$(dirname "$0")/selection_tables.py" "$WS" --candidates "$C" --ks "${KS// /,}" --out "$WS/selection.png"
