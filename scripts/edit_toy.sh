#!/usr/bin/env bash
# The editing toy (training/edit_toy.py; docs/RESULTS.md, "The editing
# toy"): a language of overlapping three-token words whose per-slot most
# likely tokens spell a non-word, where a drafter's edit passes must help
# if they work at all. Drafters train with the unchanged `dedit-train
# drafter`, the shipped target (checkpoints/tiny/target) as the feature
# extractor.
#
#   scripts/edit_toy.sh OUT
#       regenerates the data: OUT/data/{spec.json,train.bin,heldout.bin}.
#   scripts/edit_toy.sh --train OUT [RUN...]
#       the data, then trains each RUN (default: the whole sweep below)
#       into OUT/RUN/drafter and scores it into OUT/RUN/eval.json. Each
#       stage resumes: rerun the same command (MAX_MINUTES bounds a call,
#       exit 75 when it stopped early).
#   scripts/edit_toy.sh --eval DRAFTER [CAUSAL_TWIN]
#       fresh held-out toy data (SEED, default the time), every pass's
#       drafts and the neighbour oracle, scored against the sampled
#       sequences and the analytic ceiling. CAUSAL_TWIN defaults to
#       DRAFTER's sibling drafter-causal when there is one. The last line is
#       one JSON object: p1_tau, p3_tau, oracle_gain_points (at the
#       ambiguous slots), causal_p3_tau (the causal twin's P3), ceiling_tau,
#       and more (training/edit_toy.py score).
#
# The sweep's runs (NAME = depth, ProposalMix, editor mask, seed):
#   d2-mix-s1 d2-mix-s2 d2-mix-s3        depth 2, ProposalMix, seeds 1-3
#   d2-nomix-s1 d2-nomix-s2 d2-nomix-s3  the same without ProposalMix
#   d2-causal-s1                         depth 2, the causal editor
#   d1-mix-s1 d4-mix-s1                  depths 1 and 4
#   d2-truth-s1                          ProposalMix that hands the editor
#                                        the ground truth at a uniform half
#                                        of the slots (--edit_truth_share
#                                        0.5) instead of where P1 is sure
#   d2-blend-s1                          half of the blocks take the truth
#                                        at a uniform 75% of their slots,
#                                        the others ProposalMix at eta 0.5
#                                        (--edit_truth_blocks 0.5)
#   d2-blend-s2 d2-blend-s3 d4-blend-s1  its other seeds, and depth 4
#   d2-blend90-s1 d2-blend90-s2 d2-blend90-s3
#                                        the blend with the truth at 90% of
#                                        a uniform block's slots, nearer
#                                        the oracle's probe (one slot P1's,
#                                        the rest the truth)
#   d2-mix-s1-right d2-causal-s1-right   the "right" words (edit_toy.py
#                                        --shapes right), whose fix needs
#                                        the later slots
#   d2-mix-s2-right d2-mix-s3-right d2-causal-s2-right d2-causal-s3-right
#   d2-causal-s2 d2-causal-s3            the twins' other seeds
#   d2-blend90w0-s1                      blend90 with no edit loss where
#                                        the editor's input is the truth
#                                        (--edit_selected_weight 0): it
#                                        learns only the slots it must fix
#   d2-blend90-s1-right d2-blend90-s2-right
#                                        blend90 on the right words
#   d2-blend90-causal-s1-right           its causal-trained twin
#   (a name's wN sets that weight to N/10; -causal before the seed makes
#   any variant's causal-trained twin, e.g. d2-blend90-causal-s1.
#   docs/RESULTS.md also has d2-blend90-s1..3 and d2-blend90-causal-s1
#   at STEPS=3000 in their own OUT.)
# checkpoints/edit-toy/drafter is STEPS=3000 d2-blend90-s1, drafter-causal
# STEPS=3000 d2-blend90-causal-s1; right/ holds d2-blend90-s1-right and
# d2-blend90-causal-s1-right (1,500 steps).
#
# Environment: BUILD (default build; needs training/dedit-train), TARGET
# (default checkpoints/tiny/target), THREADS (default 1), MAX_MINUTES
# (default 0, no bound), STEPS (default 1500), SEED and HELDOUT (--eval's
# data: its seed, default the time, and its sequences, default 32).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${BUILD:-build}"
[[ "$BUILD" = /* ]] || BUILD="$ROOT/$BUILD"
TARGET="${TARGET:-$ROOT/checkpoints/tiny/target}"
THREADS="${THREADS:-1}"
MAX_MINUTES="${MAX_MINUTES:-0}"
STEPS="${STEPS:-1500}"
TRAIN="$BUILD/training/dedit-train"
TOY="python3 $ROOT/training/edit_toy.py"
SWEEP=(d2-mix-s1 d2-mix-s2 d2-mix-s3 d2-nomix-s1 d2-nomix-s2 d2-nomix-s3
       d2-causal-s1 d1-mix-s1 d4-mix-s1 d2-truth-s1 d2-blend-s1
       d2-blend-s2 d2-blend-s3 d4-blend-s1 d2-blend90-s1 d2-blend90-s2
       d2-blend90-s3 d2-mix-s1-right d2-causal-s1-right d2-mix-s2-right
       d2-mix-s3-right d2-causal-s2-right d2-causal-s3-right d2-causal-s2
       d2-causal-s3 d2-blend90w0-s1 d2-blend90-s1-right d2-blend90-s2-right
       d2-blend90-causal-s1-right)

usage() {
  echo "usage: $0 OUT | --train OUT [RUN...] | --eval DRAFTER [CAUSAL_TWIN]" >&2
  exit 2
}
need_train() {
  if [[ ! -x "$TRAIN" ]]; then
    echo "edit_toy: $TRAIN not built (make build, or set BUILD)" >&2
    exit 1
  fi
}
target_sum() { sha256sum "$TARGET/model.safetensors" | cut -d' ' -f1; }

# The language is fixed (--language_seed 0; its word shapes $5, default
# left), the sequences come from $2.
generate() {  # OUT_DATA SEED TRAIN HELDOUT [SHAPES]
  $TOY generate --tokenizer "$TARGET/tokenizer.json" --out "$1" --seed "$2" \
    --train "$3" --heldout "$4" --shapes "${5:-left}" >&2
}
# The word shapes a drafter was trained on (its edit_toy.json; left when
# it has none).
shapes_of() {  # DRAFTER
  python3 -c 'import json,sys
try: print(json.load(open(sys.argv[1])).get("shapes", "left"))
except OSError: print("left")' "$1/edit_toy.json"
}

# Drafts of DRAFTER on DATA's held-out sequences into OUT (JSON lines).
drafts() {  # DRAFTER DATA OUT [MASK]
  "$TRAIN" drafts --threads="$THREADS" --target="$TARGET" --drafter="$1" \
    --data="$2/heldout.bin" --window=16 --draft_passes=4 \
    --edit_mask="${4:-as_trained}" --report="$3"
}

# DRAFTER's drafts and, on the same weights, the causal mask's, on DATA,
# scored (edit_toy.py score; further arguments go to it) into stdout;
# the drafts go to WORK.
score_drafter() {  # DRAFTER DATA WORK [SCORE_ARGS...]
  local drafter="$1" data="$2" work="$3"
  shift 3
  drafts "$drafter" "$data" "$work/drafts.jsonl"
  drafts "$drafter" "$data" "$work/masked.jsonl" causal
  $TOY score --spec "$data/spec.json" --data "$data/heldout.bin" \
    --drafts "$work/drafts.jsonl" --same_weights_causal "$work/masked.jsonl" \
    "$@"
}

# Refuses a drafter trained against another target: its features would be
# another model's.
check_target() {  # DRAFTER
  local stamp="$1/edit_toy.json"
  if [[ -f "$stamp" ]]; then
    local want
    want=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["target_sha256"])' "$stamp")
    if [[ "$want" != "$(target_sum)" ]]; then
      echo "edit_toy: $1 was trained on another target than $TARGET" \
           "(retrain: scripts/edit_toy.sh --train OUT)" >&2
      exit 1
    fi
  fi
}

evaluate() {  # DRAFTER [CAUSAL_TWIN]
  local drafter="$1" twin="${2:-}"
  need_train
  [[ -f "$drafter/config.json" ]] || { echo "edit_toy: no drafter at $drafter" >&2; exit 1; }
  if [[ -z "$twin" && -f "$(dirname "$drafter")/drafter-causal/config.json" &&
        "$(cd "$(dirname "$drafter")/drafter-causal" && pwd)" != "$(cd "$drafter" && pwd)" ]]; then
    twin="$(dirname "$drafter")/drafter-causal"
  fi
  check_target "$drafter"
  [[ -n "$twin" ]] && check_target "$twin"
  work=$(mktemp -d)  # global: the EXIT trap runs after this function
  trap 'rm -rf "${work:-}"' EXIT
  generate "$work/data" "${SEED:-$(date +%s)}" 0 "${HELDOUT:-32}" \
    "$(shapes_of "$drafter")"
  local extra=()
  if [[ -n "$twin" ]]; then
    drafts "$twin" "$work/data" "$work/twin.jsonl"
    extra=(--causal_drafts "$work/twin.jsonl")
  fi
  score_drafter "$drafter" "$work/data" "$work" "${extra[@]}"
}

# One sweep run's trainer flags.
run_flags() {  # NAME
  local name="$1" depth mix causal seed truth=0 blocks=() weight=1
  local re='^d([124])-(mix|nomix|causal|truth|blend([0-9][0-9])?)(w([0-9]))?(-causal)?-s([0-9]+)(-right)?$'
  [[ "$name" =~ $re ]] || {
    echo "edit_toy: unknown run $name (d<1|2|4>-<mix|nomix|causal|truth|blend[NN]>[w<N>][-causal]-s<N>[-right])" >&2
    exit 2
  }
  depth=${BASH_REMATCH[1]}
  mix=true causal=false seed=${BASH_REMATCH[7]}
  local kind=${BASH_REMATCH[2]} share=${BASH_REMATCH[3]}
  [[ $kind = nomix ]] && mix=false
  [[ $kind = causal || -n ${BASH_REMATCH[6]} ]] && causal=true
  [[ $kind = truth ]] && truth=0.5
  # blendNN: the uniform truth at NN% of the slots (blend: 75%).
  [[ $kind = blend* ]] && truth=0.${share:-75} blocks=(--edit_truth_blocks=0.5)
  # wN: the edit loss at the slots whose input is the ground truth weighs
  # N/10 (w0: the editor learns only where its input is P1's guess, as the
  # neighbour oracle probes it).
  [[ -n ${BASH_REMATCH[4]} ]] && weight=0.${BASH_REMATCH[5]}
  # -causal: the causal-trained twin of the variant before it (the same
  # seed, depth and words; d<D>-causal-s<N> is d<D>-mix's twin).
  # The chat drafter's recipe (scripts/train_tiny.sh chat) at block 16,
  # with the paper's ProposalMix: a fixed eta of 0.5 instead of the chat
  # recipe's adaptive one (--gt_selection_ratio), with which the editor
  # learned less here (docs/RESULTS.md, "The editing toy").
  echo --drafter_layers="$depth" --proposal_mix="$mix" \
    --causal_editor="$causal" --seed="$seed" --block_size=16 \
    --target_layer_ids=0,5,10 --sequences_per_step=4 --blocks_per_sequence=32 \
    --steps="$STEPS" --p1_only_steps=$((STEPS / 5)) --plateau_delta=0.005 \
    --gt_selection_ratio=0 --eta=0.5 --edit_truth_share="$truth" --lr=2e-3 \
    --eval_every=100 --heldout_blocks=8 --edit_selected_weight="$weight" \
    "${blocks[@]}"
}

train_runs() {  # OUT RUN...
  local out="$1"
  shift
  need_train
  local runs=("$@")
  [[ ${#runs[@]} -gt 0 ]] || runs=("${SWEEP[@]}")
  local name flags shapes data
  for name in "${runs[@]}"; do
    local dir="$out/$name"
    flags=$(run_flags "$name")
    shapes=left data="$out/data"
    [[ "$name" = *-right ]] && shapes=right data="$out/data-right"
    [[ -f "$data/heldout.bin" ]] || generate "$data" 1 4096 32 "$shapes"
    if [[ ! -f "$dir/drafter/model.safetensors" ]]; then
      mkdir -p "$dir"
      # shellcheck disable=SC2086  # $flags holds separate flags
      "$TRAIN" drafter --threads="$THREADS" --max_minutes="$MAX_MINUTES" \
        --checkpoint_every_s=120 --target="$TARGET" \
        --data="$data/train.bin" --heldout_data="$data/heldout.bin" \
        --work_dir="$dir/state" --out="$dir/drafter" $flags
      python3 -c 'import json,sys; json.dump({"target_sha256": sys.argv[1], "run": sys.argv[2], "shapes": sys.argv[3], "flags": sys.argv[4]}, open(sys.argv[5], "w"), indent=1)' \
        "$(target_sum)" "$name" "$shapes" "$flags" "$dir/drafter/edit_toy.json"
    fi
    if [[ ! -f "$dir/eval.json" ]]; then
      score_drafter "$dir/drafter" "$data" "$dir" > "$dir/eval.json.tmp"
      mv "$dir/eval.json.tmp" "$dir/eval.json"
      rm -f "$dir/drafts.jsonl" "$dir/masked.jsonl"
    fi
    echo "$name: $(cat "$dir/eval.json")"
  done
}

[[ $# -ge 1 ]] || usage
case "$1" in
  --eval) [[ $# -ge 2 && $# -le 3 ]] || usage; evaluate "$2" "${3:-}" ;;
  --train) [[ $# -ge 2 ]] || usage; shift; train_runs "$@" ;;
  -*) usage ;;
  *) [[ $# -eq 1 ]] || usage; generate "$1/data" 1 4096 32 ;;
esac
