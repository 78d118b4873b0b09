#!/usr/bin/env bash
# Trains the bundled tiny model pair end to end with dedit-train, on CPU:
#   tokenizer -> target -> distill -> drafter (+ the no-ProposalMix ablation)
#   -> eval -> copy into checkpoints/tiny/{target,drafter[,drafter-seeded]}.
#
#   scripts/train_tiny.sh [full|smoke|chat]
#
# Profiles: full is the first 4-layer code pair; smoke a quick check;
# chat the production-shaped chat target (8 layers from scratch,
# TARGET_LAYERS=12 to grow one with TARGET_INIT_FROM, 1024 context, trained on
# the corpus plus the chat task suite, training/chat_tasks.py) with the 2-layer
# DEdit drafter (its recipe below), plus answer accuracy per family
# (scripts/eval_chat_tasks.py -> $WORK/chat-eval.json). docs/RESULTS.md "How to
# reproduce" lists the runs behind the shipped pair (a 12-layer target). The
# chat target takes hours on a small CPU: run it with MAX_MINUTES (resumable)
# and keep $WORK; OUT is only written when every stage has finished.
#
# Resumable: every stage checkpoints under $WORK and a finished stage is
# skipped, so rerunning the same command continues where it stopped. With
# MAX_MINUTES=N each training stage stops cleanly after N minutes (exit 75
# from dedit-train); run the script again to go on.
#
# Environment:
#   BUILD        build directory holding training/dedit-train (default build)
#   WORK         scratch directory (default $BUILD/train-tiny-<profile>)
#   OUT          where the finished pair is copied (default checkpoints/tiny;
#                empty = do not copy)
#   MAX_MINUTES  per-stage time budget for this invocation (default 0 = none)
#   THREADS      libtorch threads (default: all cores)
#   ABLATION     1 = also train/eval the ablation pair: 1-layer drafters
#                with and without ProposalMix (default 1 for full, 0 for
#                smoke)
#   W32          1 = also train/eval a W=32 drafter (default 0)
#   TARGET_INIT_FROM  an exported target to start the target stage from
#                (its weights, a fresh schedule): to train a shipped model
#                further, e.g. TARGET_INIT_FROM=checkpoints/tiny/target with a
#                new WORK (default: fresh weights)
#   TARGET_LR    peak learning rate of the target stage (default: the
#                profile's; a continuation from TARGET_INIT_FROM uses less)
#   CHAT_FRACTION share of the target's windows drawn from the chat task
#                suite (chat profile; default 0.75)
#   TASK_WEIGHTS training instances per chat family relative to the
#                default (chat_tasks.py generate --weights, e.g.
#                sort=4,add=0.25), for the target stage only ($WORK/
#                tasks-weighted); distillation keeps the balanced prompts
#                of $WORK/tasks, and held-out instances are the same
#   TASK_ARGS    further chat_tasks.py generate options for the target
#                stage's training instances ($WORK/tasks-weighted, with
#                TASK_WEIGHTS), e.g. "--fixed_share 0.25 --rename_min_uses 3"
#   DISTILL_FIXED (chat profile) records of the target's answers to
#                training prompts in the original suite's words
#                (chat_tasks.py --fixed_share 1: the fixed words of the
#                training pool) distilled besides the 4,096 and read after
#                them (default 1024, about a fifth of the records, as the
#                target's --fixed_share 0.25): a drafter trained on pool
#                words alone copies the original words no better than new
#                ones, and loses what the old split measures. 0 = none
#   DISTILL_JSON (chat profile) records of the target's answers to
#                training prompts on the original words with json
#                weighted 6 and reverse 2 (default 1024, read after
#                DISTILL_FIXED's): the plain drafter drafted the original
#                keys' json answers worse than the first pair's, which
#                had memorised them. 0 = none
#   TARGET_STEPS steps of the chat profile's target stage (default 3000)
#   TARGET_RESCHEDULE_FROM  the TARGET_STEPS a paused target stage was
#                started with: resume it on a schedule of TARGET_STEPS
#                instead (to finish a long run sooner)
#   TARGET_LAYERS layers of the chat profile's target (default 8); with
#                TARGET_INIT_FROM a shallower target is grown to it
#                (dedit-train target --init_from: new layers start as
#                identities)
#   DRAFTER_FEATURE_LAYERS the target layers the chat drafter reads
#                (default 0,3,6; spread them over a deeper target)
#   DRAFTER_STEPS / ABLATION_STEPS  steps of the chat profile's drafter and
#                of its ProposalMix twins (defaults 1200 and 300)
#   DRAFTER_LAYERS  the chat profile drafter's layers (default 2)
#   DRAFTER_LR   peak learning rate of the chat drafter (default 2e-3; a
#                continuation from DRAFTER_INIT_FROM may want less: a
#                restart at 2e-3 first loses some of the drafter's
#                slot-1 accuracy)
#   DRAFTER_ROUND_ANCHORS the share of the chat drafter's blocks placed
#                where its own rounds land (dedit-train drafter
#                --round_anchor_share; default 0, all uniform)
#   DRAFTER_LOOKUP_SEED the chat drafter's P1 reads the prompt lookup's
#                proposal (suffixes of at least this many tokens) instead
#                of masks (dedit-train drafter --lookup_seed_ngram; default
#                0, masks); the drafter's trust in its seed is then fitted
#                on training prompts (scripts/fit_seed_bonus.py --write)
#   DRAFTER_SEED_BONUS a seeded chat drafter trains with this trust in its
#                seed in every pass (dedit-train drafter --seed_logit_bonus;
#                default 0; the shipped seeded drafter's last 400 steps
#                used 8); the fit above still follows
#   DRAFTER_P1_ONLY_STEPS the chat drafter's P1-alone steps before joint
#                training (default DRAFTER_STEPS / 2; it ends earlier
#                when held-out slot-1 accuracy plateaus)
#   DRAFTER_INIT_FROM an exported drafter of the same shape that the chat
#                drafter starts from (its weights, a fresh schedule): to
#                train a shipped drafter further, with a new WORK; one of
#                fewer layers than DRAFTER_LAYERS is grown (its new layers
#                start as identities)
#   SEEDED_INIT_FROM  (chat profile) also train the lookup-seeded variant,
#                drafter-seeded, from this exported seeded drafter
#                (e.g. checkpoints/tiny/drafter-seeded): the shipped recipe's
#                last stage, a continuation with its trust in the seed
#                (lookup_seed_ngram 2, seed_logit_bonus 8, lr 5e-4, joint
#                from step 0, SEEDED_STEPS steps, default 400), then the
#                trust refitted on training prompts (fit_seed_bonus.py)
#   DRAFTER_EVAL_EVERY steps between the chat drafter's held-out
#                evaluations (default 100; each is slow, so a long run
#                evaluates less often)
#   EVAL_THREADS libtorch threads of the eval stages (default 1: the tiny
#                models decode fastest on one core, and the speedups are
#                measured like that)
#
# Corpus: the Python 3.11 standard library (Debian libpython3.11-stdlib) and
# the reST sources of its documentation (Debian python3.11-doc), both under
# the PSF License; held-out files are chosen by path hash.
set -euo pipefail

profile=${1:-full}
repo=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${BUILD:-$repo/build}
WORK=${WORK:-$BUILD/train-tiny-$profile}
OUT=${OUT-$repo/checkpoints/tiny}
MAX_MINUTES=${MAX_MINUTES:-0}
THREADS=${THREADS:-0}
EVAL_THREADS=${EVAL_THREADS:-1}
train="$BUILD/training/dedit-train"

case "$profile" in
  full)
    ABLATION=${ABLATION:-1}
    W32=${W32:-0}
    vocab=2048
    target_args=(--hidden_size=192 --intermediate_size=512 --num_layers=4
                 --num_heads=6 --num_kv_heads=2 --head_dim=32 --seq_len=256
                 --batch_size=16 --steps=1000 --lr=2e-3 --eval_every=250)
    distill_args=(--num_sequences=2048 --prompt_min=16 --prompt_max=96
                  --continuation=160 --distill_batch=64)
    # The shipped drafter has 2 layers: a 1-layer drafter cannot compose
    # attention (find a repeat, then copy what followed it), and in the
    # target's loops it got slot 1 right and slot 2 never
    # (docs/log/2026-12-06-results-notebook.md, "What was tried").
    drafter_args=(--drafter_layers=2 --block_size=16 --target_layer_ids=1,2,3
                  --sequences_per_step=4 --blocks_per_sequence=32
                  --steps=1000 --lr=2e-3 --eval_every=250)
    eval_args=(--num_prompts=48 --prompt_tokens=64 --max_new_tokens=128)
    ;;
  smoke)
    ABLATION=${ABLATION:-0}
    W32=${W32:-0}
    vocab=2048
    target_args=(--hidden_size=192 --intermediate_size=512 --num_layers=4
                 --num_heads=6 --num_kv_heads=2 --head_dim=32 --seq_len=256
                 --batch_size=8 --steps=300 --lr=2e-3 --eval_every=100)
    distill_args=(--num_sequences=256 --prompt_min=16 --prompt_max=96
                  --continuation=128 --distill_batch=64)
    drafter_args=(--drafter_layers=1 --block_size=16 --target_layer_ids=1,2,3
                  --sequences_per_step=4 --blocks_per_sequence=32
                  --steps=300 --lr=2e-3 --eval_every=100)
    eval_args=(--num_prompts=8 --prompt_tokens=64 --max_new_tokens=96)
    ;;
  chat)
    ABLATION=${ABLATION:-0}
    W32=${W32:-0}
    vocab=2048
    chat_tasks=(--train=20000 --heldout=35)
    target_tasks="$WORK/tasks"
    [ -n "${TASK_WEIGHTS:-}" ] && target_tasks="$WORK/tasks-weighted"
    # 8 narrow layers (8x the 1-layer drafter), exported for a 1024-token
    # context, trained on 512-token windows (a rename prompt + answer is
    # 300-440 tokens), 3/4 of them chat tasks with the loss on answers only.
    target_args=(--hidden_size=128 --intermediate_size=384
                 --num_layers="${TARGET_LAYERS:-8}"
                 --num_heads=4 --num_kv_heads=2 --head_dim=32 --seq_len=512
                 --max_positions=1024 --batch_size=8 --steps="${TARGET_STEPS:-3000}"
                 --lr="${TARGET_LR:-2e-3}" --eval_every=200
                 --chat_tasks="$target_tasks"
                 --chat_fraction="${CHAT_FRACTION:-0.75}")
    # The target's own answers to training task prompts (70%) and to corpus
    # windows; distill-heldout.bin: its answers to every held-out instance
    # (held-out files and values), for the drafter's evaluation.
    distill_args=(--num_sequences=4096 --prompt_min=16 --prompt_max=96
                  --continuation=448 --distill_batch=64
                  --chat_prompts="$WORK/tasks/train.jsonl" --chat_fraction=0.7)
    heldout_distill_args=(--num_sequences=245 --continuation=448
                          --distill_batch=35
                          --chat_prompts="$WORK/tasks/heldout.jsonl"
                          --chat_fraction=1)
    # The DEdit drafter (docs/log/2026-12-06-results-notebook.md, "the DEdit
    # drafter recipe"): 2 layers (copying needs two hops: read the previous
    # slot, then find it in the context, which one layer cannot compose), block
    # 32 trained on blocks of 16 and 32 (one drafter for W = 16 and 32), a low
    # feature layer (0) so context keys carry token identity, 32 anchors per
    # sequence, P1 alone until held-out slot-1 accuracy plateaus, then P1 + P2
    # with ProposalMix's eta adapted per batch (ground truth for 0.875 x P1
    # accuracy of the slots), evaluated on the held-out instances' answers.
    drafter_steps=${DRAFTER_STEPS:-1200}
    drafter_args=(--drafter_layers="${DRAFTER_LAYERS:-2}" --block_size=32
                  --train_windows=16,32
                  --target_layer_ids="${DRAFTER_FEATURE_LAYERS:-0,3,6}"
                  --sequences_per_step=4
                  --blocks_per_sequence=32 --steps="$drafter_steps"
                  --p1_only_steps="${DRAFTER_P1_ONLY_STEPS:-$((drafter_steps / 2))}"
                  --plateau_delta=0.005
                  --gt_selection_ratio=0.875 --lr="${DRAFTER_LR:-2e-3}"
                  --round_anchor_share="${DRAFTER_ROUND_ANCHORS:-0}"
                  --lookup_seed_ngram="${DRAFTER_LOOKUP_SEED:-0}"
                  --seed_logit_bonus="${DRAFTER_SEED_BONUS:-0}"
                  --eval_every="${DRAFTER_EVAL_EVERY:-100}"
                  --heldout_data="$WORK/distill-heldout.bin" --heldout_blocks=8)
    # The ProposalMix ablation twin (ABLATION=1): same data, seed and
    # schedule shape, fewer steps, with and without ProposalMix.
    ablation_steps=${ABLATION_STEPS:-300}
    eval_args=(--num_prompts=48 --prompt_tokens=64 --max_new_tokens=128)
    ;;
  *) echo "usage: $0 [full|smoke|chat]" >&2; exit 2 ;;
esac

if [ ! -x "$train" ]; then
  echo "train_tiny: $train not built (cmake --build $BUILD --target dedit-train)" >&2
  exit 1
fi
for dir in /usr/lib/python3.11 /usr/share/doc/python3.11/html/_sources; do
  if [ ! -d "$dir" ]; then
    echo "train_tiny: corpus directory $dir missing" \
         "(apt-get install libpython3.11-stdlib python3.11-doc)" >&2
    exit 1
  fi
done
mkdir -p "$WORK"
# libgomp's default active wait spins against OpenBLAS's threads on 2 cores:
# passive waiting made a drafter training step faster.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
common=(--threads="$THREADS" --checkpoint_every_s=180)
timings="$WORK/timings.txt"

# Runs one stage; exit 75 (time budget used) stops the script cleanly.
stage() {
  local name=$1; shift
  local start=$SECONDS rc=0
  echo "== $name: $*" >&2
  "$@" || rc=$?
  echo "$name $((SECONDS - start))s rc=$rc $(date -u +%FT%TZ)" >> "$timings"
  if [ "$rc" -eq 75 ]; then
    echo "train_tiny: $name paused by MAX_MINUTES; rerun to continue" >&2
    exit 75
  fi
  return "$rc"
}

if [ ! -f "$WORK/tokenizer.json" ] && [ -n "${TARGET_INIT_FROM:-}" ]; then
  # A continuation keeps its model's vocabulary: the tokenizer is learned
  # from the installed corpus, which can change with the Debian packages.
  cp "$TARGET_INIT_FROM/tokenizer.json" "$WORK/tokenizer.json"
fi
if [ ! -f "$WORK/tokenizer.json" ]; then
  stage tokenizer "$train" tokenizer --out="$WORK/tokenizer.json" --vocab_size=$vocab
fi
if [ "$profile" = chat ] && [ ! -f "$WORK/tasks/heldout.jsonl" ]; then
  stage tasks python3 "$repo/training/chat_tasks.py" generate \
    --out="$WORK/tasks" "${chat_tasks[@]}"
fi
if [ "$profile" = chat ] && [ -n "${TASK_WEIGHTS:-}" ] &&
   [ ! -f "$WORK/tasks-weighted/heldout.jsonl" ]; then
  stage tasks-weighted python3 "$repo/training/chat_tasks.py" generate \
    --out="$WORK/tasks-weighted" "${chat_tasks[@]}" --weights="$TASK_WEIGHTS" \
    ${TASK_ARGS:-}
fi
if [ ! -f "$WORK/target/model.safetensors" ]; then
  init=()
  [ -n "${TARGET_INIT_FROM:-}" ] && init=(--init_from="$(cd "$TARGET_INIT_FROM" && pwd)")
  [ -n "${TARGET_RESCHEDULE_FROM:-}" ] &&
    init+=(--reschedule_from_steps="$TARGET_RESCHEDULE_FROM")
  stage target "$train" target "${common[@]}" --max_minutes="$MAX_MINUTES" \
    --tokenizer="$WORK/tokenizer.json" --work_dir="$WORK/target-state" \
    --out="$WORK/target" --seed=1 "${target_args[@]}" "${init[@]}"
fi
if [ "$profile" = chat ] && [ ! -f "$WORK/chat-eval.json" ]; then
  stage chat-eval python3 "$repo/scripts/eval_chat_tasks.py" --build="$BUILD" \
    --target="$WORK/target" --tasks="$WORK/tasks" --methods=ar,ngram \
    --threads="$EVAL_THREADS" > "$WORK/chat-eval.json.tmp"
  mv "$WORK/chat-eval.json.tmp" "$WORK/chat-eval.json"
fi
# Distillation resumes after the last complete record of a paused or
# killed run and returns at once when the file is complete (delete it to
# distill again), so it always runs: a partial file is not a finished one.
if [ ! -f "$WORK/distill.done" ]; then
  stage distill "$train" distill "${common[@]}" --max_minutes="$MAX_MINUTES" \
    --target="$WORK/target" --work_dir="$WORK/target-state" \
    --out="$WORK/distill.bin" --seed=2 "${distill_args[@]}"
  touch "$WORK/distill.done"
fi

if [ "$profile" = chat ] && [ ! -f "$WORK/distill-heldout.done" ]; then
  stage distill-heldout "$train" distill "${common[@]}" \
    --max_minutes="$MAX_MINUTES" --target="$WORK/target" \
    --work_dir="$WORK/target-state" --out="$WORK/distill-heldout.bin" --seed=4 \
    "${heldout_distill_args[@]}"
  touch "$WORK/distill-heldout.done"
fi

# More of the drafter's records, each set read after distill.bin
# (dedit-train drafter --data takes a comma-separated list):
# distill-fixed.bin, the original words' share (DISTILL_FIXED above), and
# distill-json.bin, json-heavy answers on the original words
# (DISTILL_JSON).
drafter_data="$WORK/distill.bin"
extra_distill() {  # NAME RECORDS SEED chat_tasks.py-generate-options...
  local name="$1" records="$2" seed="$3"
  shift 3
  [ "$records" -gt 0 ] || return 0
  if [ ! -f "$WORK/tasks-$name/train.jsonl" ]; then
    stage "tasks-$name" python3 "$repo/training/chat_tasks.py" generate \
      --out="$WORK/tasks-$name" "${chat_tasks[@]}" "$@"
  fi
  if [ ! -f "$WORK/distill-$name.done" ]; then
    stage "distill-$name" "$train" distill "${common[@]}" \
      --max_minutes="$MAX_MINUTES" --target="$WORK/target" \
      --work_dir="$WORK/target-state" --out="$WORK/distill-$name.bin" \
      --seed="$seed" --num_sequences="$records" --continuation=448 \
      --distill_batch=64 --chat_prompts="$WORK/tasks-$name/train.jsonl" \
      --chat_fraction=1
    touch "$WORK/distill-$name.done"
  fi
  drafter_data+=",$WORK/distill-$name.bin"
}
if [ "$profile" = chat ]; then
  extra_distill fixed "${DISTILL_FIXED:-1024}" 6 --fixed_share=1
  extra_distill json "${DISTILL_JSON:-1024}" 8 --fixed_share=1 \
    --weights=json=6,reverse=2 --seed=8
fi

# drafter: the shipped one. drafter-1l / drafter-1l-nomix: the ProposalMix
# ablation (1 layer, with and without; in the chat profile the reduced-step
# twins drafter-mix / drafter-nomix). drafter-w32: block 32.
drafters=(drafter)
if [ "$ABLATION" = 1 ]; then
  if [ "$profile" = chat ]; then
    drafters+=(drafter-mix drafter-nomix)
  else
    drafters+=(drafter-1l drafter-1l-nomix)
  fi
fi
[ "$W32" = 1 ] && drafters+=(drafter-w32)
[ "$profile" = chat ] && [ -n "${SEEDED_INIT_FROM:-}" ] &&
  drafters+=(drafter-seeded)
for d in "${drafters[@]}"; do
  extra=(--proposal_mix=true)
  window=16
  case "$d" in
    drafter-1l) extra=(--proposal_mix=true --drafter_layers=1) ;;
    drafter-1l-nomix) extra=(--proposal_mix=false --drafter_layers=1) ;;
    drafter-mix|drafter-nomix)
      extra=(--proposal_mix=$([ "$d" = drafter-mix ] && echo true || echo false)
             --steps="$ablation_steps" --p1_only_steps=$((ablation_steps / 2))) ;;
    drafter-w32) extra=(--proposal_mix=true --block_size=32); window=32 ;;
    # Later flags win: the seeded variant's recipe over drafter_args'.
    drafter-seeded)
      extra=(--proposal_mix=true --seed=5 --lookup_seed_ngram=2
             --seed_logit_bonus=8 --lr=5e-4 --steps="${SEEDED_STEPS:-400}"
             --p1_only_steps=0
             --init_from="$(cd "$SEEDED_INIT_FROM" && pwd)") ;;
  esac
  [ "$d" = drafter ] && [ -n "${DRAFTER_INIT_FROM:-}" ] &&
    extra+=(--init_from="$(cd "$DRAFTER_INIT_FROM" && pwd)")
  if [ ! -f "$WORK/$d/model.safetensors" ]; then
    stage "$d" "$train" drafter "${common[@]}" --max_minutes="$MAX_MINUTES" \
      --target="$WORK/target" --data="$drafter_data" \
      --work_dir="$WORK/$d-state" --out="$WORK/$d" --seed=3 \
      "${drafter_args[@]}" "${extra[@]}"
  fi
  # A lookup-seeded chat drafter: its trust in the seed, fitted on training
  # prompts and written into its config (scripts/fit_seed_bonus.py).
  seeded=0
  [ "$d" = drafter-seeded ] && seeded=1
  [ "$d" = drafter ] && [ "${DRAFTER_LOOKUP_SEED:-0}" -gt 0 ] && seeded=1
  if [ "$profile" = chat ] && [ "$seeded" = 1 ] &&
     [ ! -f "$WORK/fit-seed-$d.json" ]; then
    stage "fit-seed-$d" python3 "$repo/scripts/fit_seed_bonus.py" \
      --build="$BUILD" --target="$WORK/target" --drafter="$WORK/$d" \
      --tasks="$WORK/tasks" --threads="$EVAL_THREADS" --write \
      > "$WORK/fit-seed-$d.json.tmp"
    mv "$WORK/fit-seed-$d.json.tmp" "$WORK/fit-seed-$d.json"
  fi
  if [ ! -f "$WORK/eval-$d.json" ]; then
    stage "eval-$d" "$train" eval --threads="$EVAL_THREADS" \
      --target="$WORK/target" --drafter="$WORK/$d" \
      --work_dir="$WORK/target-state" --report="$WORK/eval-$d.json" \
      --window=$window "${eval_args[@]}"
  fi
done

# The DEdit tables (chat profile): on every held-out instance, tau and
# speedup per family for P1..P4 at W = 16 and 32, the causal editor at the
# same weights, the n-gram baseline, and with ABLATION the ProposalMix twins.
if [ "$profile" = chat ] && [ ! -f "$WORK/dedit-eval.json" ]; then
  configs="ar=ar,ngram16=ngram:w=16,ngram32=ngram:w=32"
  for w in 16 32; do
    for k in 1 2 3 4; do
      configs+=",w${w}k${k}=model:w=$w:k=$k:drafter=$WORK/drafter"
    done
  done
  for k in 2 3; do
    configs+=",causal16k${k}=model:w=16:k=$k:causal:drafter=$WORK/drafter"
  done
  if [ -f "$WORK/drafter-seeded/model.safetensors" ]; then
    configs+=",seeded16=model:w=16:k=1:drafter=$WORK/drafter-seeded"
    configs+=",hybrid16=hybrid:w=16:k=1:drafter=$WORK/drafter"
  fi
  if [ "$ABLATION" = 1 ]; then
    for d in drafter-mix drafter-nomix; do
      for k in 1 2 3; do
        configs+=",${d#drafter-}16k${k}=model:w=16:k=$k:drafter=$WORK/$d"
      done
    done
  fi
  stage dedit-eval python3 "$repo/scripts/eval_chat_tasks.py" --build="$BUILD" \
    --target="$WORK/target" --tasks="$WORK/tasks" --configs="$configs" \
    --threads="$EVAL_THREADS" > "$WORK/dedit-eval.json.tmp"
  mv "$WORK/dedit-eval.json.tmp" "$WORK/dedit-eval.json"
fi

if [ -n "$OUT" ]; then
  models=(target drafter)
  [ -f "$WORK/drafter-seeded/model.safetensors" ] && models+=(drafter-seeded)
  for m in "${models[@]}"; do
    mkdir -p "$OUT/$m"
    cp "$WORK/$m/config.json" "$WORK/$m/model.safetensors" \
       "$WORK/$m/tokenizer.json" "$OUT/$m/"
    [ "$m" = target ] || cp "$WORK/eval-$m.json" "$OUT/$m/eval.json"
  done
  if [ "$profile" = chat ]; then
    # The distillation sets the drafter trains and evaluates on, and
    # the task accuracy of the target.
    mkdir -p "$OUT/distill"
    cp "$WORK/distill.bin" "$WORK/distill-heldout.bin" "$OUT/distill/"
    for f in distill-fixed.bin distill-json.bin; do
      [ -f "$WORK/$f" ] && cp "$WORK/$f" "$OUT/distill/"
    done
    cp "$WORK/chat-eval.json" "$OUT/target/chat_eval.json"
    cp "$WORK/dedit-eval.json" "$OUT/drafter/dedit_eval.json"
  fi
  echo "train_tiny: copied the pair to $OUT (sizes: $(du -sh "$OUT" | cut -f1))" >&2
fi
echo "train_tiny: done; stage timings in $timings" >&2
