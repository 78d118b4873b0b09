#!/usr/bin/env bash
# The demo: the three services (dedit-drafter, dedit-target, dedit-router)
# on CPU with the bundled trained pair (checkpoints/tiny), one streamed prompt
# through the router with speculation and once without, the acceptance
# statistics, and a check that both texts are identical (greedy decoding is
# lossless); then the same request with the n-gram method (prompt lookup in
# the router, no drafter model) and the hybrid method (per round the lookup
# when the recent tokens occurred before, else the DEdit drafter), each
# checked against target-only, and the four speeds side by side. With the chat pair (checkpoints/tiny/target has
# chat_eval.json: trained on the chat task suite, training/chat_tasks.py)
# the request is one chat task, sent as a user message, and its answer is
# checked against the reference computed from the message. Falls back to a
# generated random pair when checkpoints/tiny is missing.
#
#   scripts/demo.sh [BUILD_DIR]
#
# Environment: DEMO_CHAT (a user message in a task format) and
# DEMO_CHAT_FAMILY (its family, for the check), or DEMO_PROMPT (plain text,
# no check); DEMO_MAX_TOKENS (default 448 for a chat task, 160 otherwise),
# DEMO_WINDOW (8), DEMO_PASSES (1): the DEdit drafter's fastest setting in
# docs/RESULTS.md; DEMO_NGRAM_WINDOW (8), DEMO_TIMING_ROUNDS (5: timed
# runs per method, in turns, for the speed table; 0 times the first runs),
# DEMO_KEEP_LOGS=1 (keep the run folder), DEMO_DRAFTER (the drafter folder;
# default the pair's drafter), DEMO_PAIR (the pair's folder, default
# checkpoints/tiny), DEMO_THREADS (--threads of each model service; default
# 1 for the tiny pair, the machine's cores for the wide one).
#
# Then, unless DEMO_WIDE=0, the production regime: the same pair widened x8
# (scripts/make_wide_pair.sh, generated on first use into BUILD/wide-pair-x8,
# a 293 MB target whose weights stream from DRAM at every step, as a real
# model's do), served and timed the same way (DEMO_WIDE_WINDOW, default 16;
# DEMO_WIDE_THREADS, default the machine's cores; the widened copy of the
# drafter served above).
# It computes the tiny pair's function, so it answers alike; its speeds are
# those of a memory-bound model (docs/RESULTS.md, "The production regime").
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=$(cd "${1:-$ROOT/build}" && pwd)
CLI=$BUILD/cli/dedit-cli
[ -x "$CLI" ] || { echo "demo: $CLI not built" >&2; exit 1; }

WINDOW=${DEMO_WINDOW:-8}
PASSES=${DEMO_PASSES:-1}
NGRAM_WINDOW=${DEMO_NGRAM_WINDOW:-8}
PAIR=${DEMO_PAIR:-$ROOT/checkpoints/tiny}
PAIR_LABEL=${PAIR#$ROOT/}
THREADS=${DEMO_THREADS:-1}
SERVE_ARGS=()
CHAT_FAMILY=""
MAX_TOKENS=${DEMO_MAX_TOKENS:-160}
# The DEdit drafter served: the pair's. On the demo's multiply task it beats the
# lookup-seeded one at W=8 (2-token matches in digit strings make junk seeds);
# DEMO_DRAFTER=checkpoints/tiny/drafter-seeded serves that one, ahead on the
# held-out set (docs/RESULTS.md, "Trusting the seed").
DRAFTER=${DEMO_DRAFTER:-$PAIR/drafter}
if [ -f "$PAIR/target/model.safetensors" ] &&
   [ -f "$DRAFTER/model.safetensors" ]; then
  SERVE_ARGS=(--target-dir "$PAIR/target" --drafter-dir "$DRAFTER")
  if [ -z "${DEMO_PROMPT:-}" ] && [ -f "$ROOT/checkpoints/tiny/target/chat_eval.json" ]; then
    # A multiply task with fresh values (the suite's held-out instances are
    # drawn the same way); any message in a suite format works (DEMO_CHAT).
    CHAT_FAMILY=${DEMO_CHAT_FAMILY:-multiply}
    CHAT=${DEMO_CHAT:-"Multiply 7315 by 46."}
    PROMPT_ARGS=(--chat --prompt "$CHAT")
    MAX_TOKENS=${DEMO_MAX_TOKENS:-448}
    echo "model: $PAIR_LABEL chat pair (see checkpoints/tiny/target/MODEL_CARD.md)"
    echo "drafter: ${DRAFTER#$ROOT/} (see its MODEL_CARD.md)"
    echo "user message ($CHAT_FAMILY task):"
    printf '%s\n' "$CHAT" | sed 's/^/  | /'
  else
    PROMPT=${DEMO_PROMPT:-"def read_config(path):
    \"\"\"Read a configuration file and return a dict.\"\"\"
"}
    PROMPT_ARGS=(--prompt "$PROMPT")
    echo "model: bundled checkpoints/tiny (see checkpoints/tiny/target/MODEL_CARD.md)"
  fi
else
  PROMPT_ARGS=(--prompt_ids 1,17,42,99,7,256,3)
  echo "model: generated random pair (acceptance near 1 token per round)"
fi

RUN_DIR=$(mktemp -d "${TMPDIR:-/tmp}/dedit-demo.XXXXXX")
# Six free loopback ports: router, target, drafter and their /metrics.
read -r RP TP DP RM TM DM < <(python3 "$ROOT/scripts/free_ports.py" 6)

stop_services() {
  local pids=()
  for f in "$RUN_DIR"/router.pid "$RUN_DIR"/target.pid "$RUN_DIR"/drafter.pid; do
    [ -f "$f" ] && pids+=("$(cat "$f")")
  done
  for pid in "${pids[@]}"; do
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  done
  if [ "${DEMO_KEEP_LOGS:-0}" = 1 ]; then
    echo "demo: logs kept in $RUN_DIR"
  else
    rm -rf "$RUN_DIR"
  fi
}
trap stop_services EXIT
# A TERM or INT (kill, ^C) exits through the EXIT trap too, so the
# detached services do not outlive the demo (a KILL, as ctest's timeout
# sends, still leaves them running).
trap 'exit 143' TERM
trap 'exit 130' INT

echo "== starting dedit-drafter, dedit-target, dedit-router (CPU, --threads $THREADS each) =="
bash "$ROOT/scripts/serve.sh" --build-dir "$BUILD" --run-dir "$RUN_DIR" --detach \
  --threads "$THREADS" --router-port "$RP" --target-port "$TP" --drafter-port "$DP" \
  --metrics-ports "$RM,$TM,$DM" "${SERVE_ARGS[@]}"

echo
# Streams one request; the text goes to stdout and FILE, the CLI's summary
# line (or error) to FILE.stats.
generate() {  # file, cli flags...
  local file=$1; shift
  if ! "$CLI" generate --router "127.0.0.1:$RP" "${PROMPT_ARGS[@]}" \
      --max_tokens "$MAX_TOKENS" "$@" 2>"$file.stats" | tee "$file"; then
    echo
    echo "demo: dedit-cli generate failed:" >&2
    cat "$file.stats" >&2
    exit 1
  fi
  echo
  cat "$file.stats"
}

# Each method's dedit-cli flags, for its shown run and its timed ones.
method_args() {  # method -> sets `args`
  case $1 in
    speculative) args=(--window "$WINDOW" --passes "$PASSES") ;;
    target_only) args=(--no_speculation) ;;
    ngram) args=(--method ngram --window "$NGRAM_WINDOW") ;;
    hybrid) args=(--method hybrid --window "$WINDOW" --passes "$PASSES") ;;
  esac
}

echo "== speculative (W=$WINDOW, K=$PASSES), streamed from the router =="
method_args speculative
generate "$RUN_DIR/speculative.txt" "${args[@]}"
echo
echo "== target-only (--no_speculation), same router =="
method_args target_only
generate "$RUN_DIR/target_only.txt" "${args[@]}"
echo
echo "== n-gram method (W=$NGRAM_WINDOW, prompt lookup in the router), same router =="
method_args ngram
generate "$RUN_DIR/ngram.txt" "${args[@]}"
echo
echo "== hybrid method (W=$WINDOW, K=$PASSES: lookup when the recent tokens recur, else the DEdit drafter), same router =="
method_args hybrid
generate "$RUN_DIR/hybrid.txt" "${args[@]}"
echo
if [ -n "$CHAT_FAMILY" ]; then
  echo "== the answer, checked against the reference computed from the message =="
  if python3 "$ROOT/training/chat_tasks.py" check "$CHAT_FAMILY" "$CHAT" \
      < "$RUN_DIR/target_only.txt"; then
    echo "the target answered the $CHAT_FAMILY task correctly"
  else
    echo "demo: the target's answer is wrong (a 2M-parameter model; see checkpoints/tiny/target/chat_eval.json for its accuracy per task family)"
  fi
  echo
fi
for method in speculative ngram hybrid; do
  if cmp -s "$RUN_DIR/$method.txt" "$RUN_DIR/target_only.txt"; then
    echo "lossless: the $method text is identical to the target-only text"
  else
    echo "demo: $method and target-only texts differ" >&2
    diff "$RUN_DIR/$method.txt" "$RUN_DIR/target_only.txt" >&2 || true
    exit 1
  fi
done
# Speeds: one request is a fraction of a second, and a VM's slow spell can
# flip a single comparison, so each method runs DEMO_TIMING_ROUNDS more
# times (default 5), the methods in turns, every text checked again; the
# table gives each method's median.
ROUNDS=${DEMO_TIMING_ROUNDS:-5}
for r in $(seq 1 "$ROUNDS"); do
  for method in target_only speculative ngram hybrid; do
    method_args "$method"
    out="$RUN_DIR/$method.$r.txt"
    if ! "$CLI" generate --router "127.0.0.1:$RP" "${PROMPT_ARGS[@]}" \
        --max_tokens "$MAX_TOKENS" "${args[@]}" >"$out" 2>"$out.stats"; then
      echo "demo: dedit-cli generate failed:" >&2
      cat "$out.stats" >&2
      exit 1
    fi
    if ! cmp -s "$out" "$RUN_DIR/target_only.txt"; then
      echo "demo: $method (timing round $r) and target-only texts differ" >&2
      exit 1
    fi
  done
done
python3 - "$RUN_DIR" "$ROUNDS" <<'PY'
import re, statistics, sys
run_dir, rounds = sys.argv[1], int(sys.argv[2])
def rate(path):
    m = re.search(r"([0-9.]+) tokens/s, mean acceptance length ([0-9.]+)",
                  open(path).read())
    return (float(m.group(1)), float(m.group(2))) if m else (0.0, 0.0)
def median_rate(name):
    paths = [f"{run_dir}/{name}.{r}.txt.stats" for r in range(1, rounds + 1)]
    if not paths:
        paths = [f"{run_dir}/{name}.txt.stats"]
    rates = [rate(p) for p in paths]
    return statistics.median(r for r, _ in rates), rates[0][1]
base, _ = median_rate("target_only")
n = max(rounds, 1)
print(f"through the router (one stream, wall time incl. prefill; median of "
      f"{n} run{'s' if n > 1 else ''} per method, in turns):")
for name, label in (("target_only", "target-only"),
                    ("speculative", "DEdit drafter"),
                    ("ngram", "n-gram"),
                    ("hybrid", "hybrid")):
    r, tau = median_rate(name)
    ratio = r / base if base else 0.0
    print(f"  {label:<14} {r:8.1f} tokens/s  {ratio:5.2f}x"
          + (f"  tau {tau:.2f}" if name != "target_only" else ""))
PY
echo
echo "router metrics (http://127.0.0.1:$RM/metrics):"
python3 - "$RM" <<'PY'
import sys, urllib.request
text = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=5).read().decode()
for line in text.splitlines():
    if line.startswith(("dedit_spec_decode_num_drafts_total",
                        "dedit_spec_decode_num_accepted_tokens_total",
                        "dedit_generation_tokens_total", "dedit_fallback_rounds_total")):
        print("  " + line)
PY

# The same prompt through the in-process engine (no RPCs): on a model this
# small the gRPC round trips dominate the services' time on CPU, so the
# engine's own speedup is shown here.
GEN=$BUILD/cli/dedit-generate
if [ -x "$GEN" ] && [ ${#SERVE_ARGS[@]} -gt 0 ]; then
  echo
  echo "== in-process engine, same prompt: speculative (W=$WINDOW, K=$PASSES), n-gram (W=$NGRAM_WINDOW), target-only =="
  for mode in spec ngram ar; do
    case $mode in
      spec) args=(--drafter "$DRAFTER" --window "$WINDOW" --passes "$PASSES") ;;
      ngram) args=(--method ngram --window "$NGRAM_WINDOW") ;;
      ar) args=(--ar) ;;
    esac
    "$GEN" --target "$PAIR/target" "${args[@]}" "${PROMPT_ARGS[@]}" \
      --max_tokens "$MAX_TOKENS" --threads "$THREADS" | grep -E '^(finish|prefill)' | sed "s/^/  $mode: /"
  done
fi

# The production regime: the same pair widened x8, its weights far larger
# than the caches, served the same way on all cores.
if [ "${DEMO_WIDE:-1}" = 1 ] && [ -z "${DEMO_PAIR:-}" ] && [ ${#SERVE_ARGS[@]} -gt 0 ]; then
  stop_services
  trap - EXIT
  echo
  echo "================================================================"
  echo "== the production regime: the pair widened x8 (a 293 MB target) =="
  echo "================================================================"
  BUILD=$BUILD bash "$ROOT/scripts/make_wide_pair.sh" "$BUILD/wide-pair-x8" 8
  # The widened copy of the drafter served above (drafter or
  # drafter-seeded), else the wide pair's drafter.
  WIDE_DRAFTER=$BUILD/wide-pair-x8/$(basename "$DRAFTER")
  [ -f "$WIDE_DRAFTER/model.safetensors" ] || WIDE_DRAFTER=$BUILD/wide-pair-x8/drafter
  DEMO_PAIR=$BUILD/wide-pair-x8 DEMO_WIDE=0 DEMO_THREADS=${DEMO_WIDE_THREADS:-$(nproc)} \
    DEMO_WINDOW=${DEMO_WIDE_WINDOW:-16} DEMO_NGRAM_WINDOW=${DEMO_WIDE_WINDOW:-16} \
    DEMO_DRAFTER="$WIDE_DRAFTER" exec bash "$0" "$BUILD"
fi
