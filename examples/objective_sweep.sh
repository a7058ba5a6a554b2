#!/usr/bin/env bash
# The runs behind docs/experiments.md's two-seed checks: XE, SCST and R-DPP m = 2, 5 on
# the bundled data, fine-tuned with two seeds (123 and 7) from one XE model, each sampled (greedy,
# and 10 random captions per test image) and scored (CIDEr, oracle, self-CIDEr, diversity with the
# share of captions that end badly). Then examples/objective_tables.py prints the table.
#
# The seed-123 runs have toy_sweep.sh's names (scst, dpp-m2, dpp-m5) and the XE model its settings,
# so both scripts can share one workspace. Every step is skipped when its artifact is complete.
# To compare two versions of rdpp (CHANGELOG.md quotes 0.1.0 against 0.2.0), run this script once
# more into another workspace with RDPP="python -m rdpp_cli" from a checkout of the other version,
# and give both workspaces to objective_tables.py.
#
#   bash examples/objective_sweep.sh                     # workspace ./runs-sweep (or WS=...)
#   python examples/objective_tables.py runs-sweep [OTHER_WS]
#
# CPU, 2 cores: XE ~11 min, each fine-tune 2-13 min, sampling and scoring about a minute a model.
set -euo pipefail
WS=${WS:-runs-sweep}
RDPP=${RDPP:-rdpp}
IMAGES=${IMAGES:-3000}
XE_EPOCHS=${XE_EPOCHS:-8}
RL_EPOCHS=${RL_EPOCHS:-6}
SEEDS=${SEEDS:-"123 7"}
export RDPP_NO_PROGRESS=${RDPP_NO_PROGRESS:-1}
done_() { [ -f "$1/manifest.json" ]; }
common=(--workspace "$WS" --device cpu)

done_ "$WS/data/toy" || $RDPP prepro toy --images "$IMAGES" --workspace "$WS" --out "$WS/data/toy"
done_ "$WS/xe/xe" || $RDPP train-xe --data "$WS/data/toy" "${common[@]}" --preset small --epochs "$XE_EPOCHS" --lr 1e-3 \
  --out "$WS/xe/xe"

for seed in $SEEDS; do
  suffix=$([ "$seed" = 123 ] && echo "" || echo "-s$seed")
  for spec in "scst --reward scst" "dpp-m2 --reward dpp --m 2" "dpp-m5 --reward dpp --m 5"; do
    set -- $spec; name=$1$suffix; shift
    done_ "$WS/finetune/$name" || $RDPP finetune "$WS/xe/xe" "${common[@]}" --epochs "$RL_EPOCHS" --lr 1e-4 \
      --seed "$seed" --out "$WS/finetune/$name" "$@"
  done
done

for model in "$WS/xe/xe" "$WS"/finetune/scst* "$WS"/finetune/dpp-m2 "$WS"/finetune/dpp-m2-s* "$WS"/finetune/dpp-m5 \
             "$WS"/finetune/dpp-m5-s*; do
  [ -d "$model" ] || continue
  name=$(basename "$model")
  done_ "$WS/samples/$name-greedy" || $RDPP sample "$model" "${common[@]}" --split test --method greedy --n 1 \
    --out "$WS/samples/$name-greedy"
  done_ "$WS/samples/$name-random10" || $RDPP sample "$model" "${common[@]}" --split test --method random --n 10 \
    --out "$WS/samples/$name-random10"
  done_ "$WS/scores/$name-greedy" || $RDPP score "$WS/samples/$name-greedy" --workspace "$WS" --metrics CIDEr \
    --out "$WS/scores/$name-greedy"
  done_ "$WS/scores/$name-random10" || $RDPP score "$WS/samples/$name-random10" --workspace "$WS" \
    --oracle --self-cider --diversity --metrics CIDEr --out "$WS/scores/$name-random10"
done
