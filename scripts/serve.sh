#!/usr/bin/env bash
# Starts dedit-drafter, dedit-target and dedit-router locally, each on its
# chosen device, waits until all three report SERVING on grpc.health.v1, and
# keeps them in the foreground; Ctrl-C (or SIGTERM) drains and stops them.
#
#   scripts/serve.sh                                  # tiny random models, CPU
#   scripts/serve.sh --target-dir models/Qwen3-4B --drafter-dir models/Qwen3-4B-DEdit \
#       --target-device cuda:1 --drafter-device cuda:0 --dtype bfloat16
#   dedit-cli generate --router 127.0.0.1:50050 --prompt "Hello" --chat
#
# Flags: --build-dir DIR (build), --run-dir DIR (logs, /tmp/dedit-serve),
# --tokenizer PATH (default <target-dir>/tokenizer.json if present),
# --router-port/--target-port/--drafter-port (50050/50051/50052),
# --metrics-ports R,T,D (9100,9101,9102), --threads N (CPU compute threads
# per model service, libtorch's and the weight-product pool's; 0 = the
# machine's cores), --product-threads N (threads per model thread for the
# weight products; common/model/cpu/cpu_product_pool.h; default 0 = follow --threads),
# --cpu-products KERNEL (both model services' weight products: blas, f32 or
# bf16; common/model/cpu/cpu_panels.h; default auto, the fastest the CPU runs),
# --kv-cache-dtype auto|bf16 (both model services' K/V caches;
# common/model/kv_pool.h; default auto), --idle-spin-us N (the model services
# poll N µs for the next call before sleeping; common/base/spin_wait.h; default
# 0), --drafter-idle-spin-us N (the drafter's alone; default
# --idle-spin-us), --min-draft-confidence C (the router cuts drafter drafts before
# their first slot less confident than C; 0 = off), --verify-chunk N (the
# router verifies drafter drafts N block rows per round, the rest of a
# draft next round; 0 = whole drafts), --max-speculative-batch N (a round
# of more than N running requests speculates for none of them; 0 = no
# limit), --adaptive-speculation (per request, speculate only while it
# pays), --no-drafter, --detach (start,
# wait for health, exit leaving the services running; stop them with
# `kill $(cat RUN_DIR/*.pid)`).
#
# Internal calls (router -> target, router -> drafter, target -> drafter)
# carry a shared token by default: serve.sh writes a fresh one to
# RUN_DIR/internal.token (mode 0600) and passes it to all three, so that
# nothing else on the host can call Target.Prefill or read the drafter's
# context. --internal-token-file F uses F instead (several serve.sh runs,
# or a second router, sharing one target); --insecure-internal runs them
# in plaintext with no token. Clients of the router's public port need no
# token.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD="$ROOT/build"
RUN_DIR=/tmp/dedit-serve
TARGET_DIR=""
DRAFTER_DIR=""
TOKENIZER=""
TARGET_DEVICE=cpu
DRAFTER_DEVICE=cpu
DTYPE=float32
ROUTER_PORT=50050
TARGET_PORT=50051
DRAFTER_PORT=50052
METRICS_PORTS=9100,9101,9102
WITH_DRAFTER=1
DETACH=0
HOST=127.0.0.1
THREADS=0
PRODUCT_THREADS=0
CPU_PRODUCTS=auto
KV_CACHE_DTYPE=auto
IDLE_SPIN_US=0
DRAFTER_IDLE_SPIN_US=
MIN_DRAFT_CONFIDENCE=0
VERIFY_CHUNK=0
MAX_SPECULATIVE_BATCH=0
ADAPTIVE_SPECULATION=false
INTERNAL_TOKEN_FILE=""
INSECURE_INTERNAL=0

while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir) BUILD=$2; shift 2 ;;
    --run-dir) RUN_DIR=$2; shift 2 ;;
    --target-dir) TARGET_DIR=$2; shift 2 ;;
    --drafter-dir) DRAFTER_DIR=$2; shift 2 ;;
    --tokenizer) TOKENIZER=$2; shift 2 ;;
    --target-device) TARGET_DEVICE=$2; shift 2 ;;
    --drafter-device) DRAFTER_DEVICE=$2; shift 2 ;;
    --dtype) DTYPE=$2; shift 2 ;;
    --router-port) ROUTER_PORT=$2; shift 2 ;;
    --target-port) TARGET_PORT=$2; shift 2 ;;
    --drafter-port) DRAFTER_PORT=$2; shift 2 ;;
    --metrics-ports) METRICS_PORTS=$2; shift 2 ;;
    --host) HOST=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --product-threads) PRODUCT_THREADS=$2; shift 2 ;;
    --cpu-products) CPU_PRODUCTS=$2; shift 2 ;;
    --kv-cache-dtype) KV_CACHE_DTYPE=$2; shift 2 ;;
    --idle-spin-us) IDLE_SPIN_US=$2; shift 2 ;;
    --drafter-idle-spin-us) DRAFTER_IDLE_SPIN_US=$2; shift 2 ;;
    --min-draft-confidence) MIN_DRAFT_CONFIDENCE=$2; shift 2 ;;
    --verify-chunk) VERIFY_CHUNK=$2; shift 2 ;;
    --max-speculative-batch) MAX_SPECULATIVE_BATCH=$2; shift 2 ;;
    --adaptive-speculation) ADAPTIVE_SPECULATION=true; shift ;;
    --internal-token-file) INTERNAL_TOKEN_FILE=$2; shift 2 ;;
    --insecure-internal) INSECURE_INTERNAL=1; shift ;;
    --no-drafter) WITH_DRAFTER=0; shift ;;
    --detach) DETACH=1; shift ;;
    -h|--help) sed -n '2,41p' "$0"; exit 0 ;;
    *) echo "serve.sh: unknown flag $1" >&2; exit 2 ;;
  esac
done
IFS=, read -r ROUTER_METRICS TARGET_METRICS DRAFTER_METRICS <<< "$METRICS_PORTS"

for bin in dedit-target dedit-drafter dedit-router; do
  if ! find "$BUILD" -name "$bin" -type f -perm -u+x | grep -q .; then
    echo "serve.sh: $bin not built in $BUILD (cmake --build $BUILD)" >&2
    exit 1
  fi
done
bin() { find "$BUILD" -name "$1" -type f -perm -u+x | head -1; }

mkdir -p "$RUN_DIR"
if [ -z "$TARGET_DIR" ]; then
  TARGET_DIR="$RUN_DIR/tiny/target"
  DRAFTER_DIR="$RUN_DIR/tiny/drafter"
  if [ ! -f "$TARGET_DIR/config.json" ]; then
    echo "serve.sh: no --target-dir; writing tiny random models to $RUN_DIR/tiny"
    "$(bin dedit-make-tiny-model)" --out "$RUN_DIR/tiny" >/dev/null
  fi
fi
if [ -z "$TOKENIZER" ] && [ -f "$TARGET_DIR/tokenizer.json" ]; then
  TOKENIZER="$TARGET_DIR/tokenizer.json"
fi
if [ "$WITH_DRAFTER" = 1 ] && [ -z "$DRAFTER_DIR" ]; then
  echo "serve.sh: --drafter-dir is required with --target-dir (or --no-drafter)" >&2
  exit 2
fi

AUTH_ARGS=()
if [ "$INSECURE_INTERNAL" = 0 ]; then
  if [ -z "$INTERNAL_TOKEN_FILE" ]; then
    INTERNAL_TOKEN_FILE="$RUN_DIR/internal.token"
    (umask 077 && od -An -tx1 -N32 /dev/urandom | tr -d ' \n' \
       > "$INTERNAL_TOKEN_FILE")
  elif [ ! -r "$INTERNAL_TOKEN_FILE" ]; then
    echo "serve.sh: --internal-token-file $INTERNAL_TOKEN_FILE is not readable" >&2
    exit 2
  fi
  AUTH_ARGS=(--internal_token_file "$INTERNAL_TOKEN_FILE")
  echo "serve.sh: internal calls carry the token in $INTERNAL_TOKEN_FILE"
else
  echo "serve.sh: --insecure-internal: internal calls in plaintext, no token"
fi

PIDS=()
stop_all() {
  # Router first (it drains client streams), then the services it uses.
  for ((i=${#PIDS[@]}-1; i>=0; i--)); do kill -TERM "${PIDS[$i]}" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
}

start() {  # name, args...
  local name=$1; shift
  rm -f "$RUN_DIR/$name.ready"
  "$(bin "dedit-$name")" "$@" "${AUTH_ARGS[@]}" \
      --ready_file="$RUN_DIR/$name.ready" \
      >"$RUN_DIR/$name.log" 2>&1 &
  local pid=$!
  echo "$pid" > "$RUN_DIR/$name.pid"
  PIDS=("$pid" "${PIDS[@]}")
  for _ in $(seq 1 1200); do
    [ -f "$RUN_DIR/$name.ready" ] && return 0
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "serve.sh: dedit-$name exited; log:" >&2
      tail -20 "$RUN_DIR/$name.log" >&2
      stop_all
      exit 1
    fi
    sleep 0.1
  done
  echo "serve.sh: dedit-$name did not start (see $RUN_DIR/$name.log)" >&2
  stop_all
  exit 1
}

TARGET_ARGS=(--target_dir "$TARGET_DIR" --device "$TARGET_DEVICE" --dtype "$DTYPE" --threads "$THREADS"
             --product_threads "$PRODUCT_THREADS" --cpu_products "$CPU_PRODUCTS"
             --kv_cache_dtype "$KV_CACHE_DTYPE" --host "$HOST" --port "$TARGET_PORT" --metrics_port "$TARGET_METRICS"
             --idle_spin_us "$IDLE_SPIN_US")
ROUTER_ARGS=(--target "$HOST:$TARGET_PORT" --host "$HOST" --port "$ROUTER_PORT"
             --metrics_port "$ROUTER_METRICS")
[ -n "$TOKENIZER" ] && ROUTER_ARGS+=(--tokenizer "$TOKENIZER")
ROUTER_ARGS+=(--min_draft_confidence "$MIN_DRAFT_CONFIDENCE" --verify_chunk "$VERIFY_CHUNK"
             --max_speculative_batch "$MAX_SPECULATIVE_BATCH"
             --adaptive_speculation="$ADAPTIVE_SPECULATION")
if [ "$WITH_DRAFTER" = 1 ]; then
  start drafter --drafter_dir "$DRAFTER_DIR" --target_dir "$TARGET_DIR" \
      --device "$DRAFTER_DEVICE" --dtype "$DTYPE" --threads "$THREADS" \
      --product_threads "$PRODUCT_THREADS" --cpu_products "$CPU_PRODUCTS" \
      --kv_cache_dtype "$KV_CACHE_DTYPE" --host "$HOST" --port "$DRAFTER_PORT" --metrics_port "$DRAFTER_METRICS" \
      --idle_spin_us "${DRAFTER_IDLE_SPIN_US:-$IDLE_SPIN_US}"
  TARGET_ARGS+=(--drafter "$HOST:$DRAFTER_PORT" --drafter_dir "$DRAFTER_DIR")
  ROUTER_ARGS+=(--drafter "$HOST:$DRAFTER_PORT")
fi
trap 'stop_all; exit 0' INT TERM
start target "${TARGET_ARGS[@]}"
start router "${ROUTER_ARGS[@]}"

# Health: the ready files mean each server is up; the drafter is only
# ready for drafting once the target's context stream is attached.
PY_STUBS=$(find "$BUILD" -type d -path '*proto/python' | head -1)
if [ -n "$PY_STUBS" ]; then
  /usr/bin/python3 - "$PY_STUBS" "$HOST" "$ROUTER_PORT" "$TARGET_PORT" \
      "$([ "$WITH_DRAFTER" = 1 ] && echo "$DRAFTER_PORT" || echo 0)" <<'PY'
import sys, time
sys.path.insert(0, sys.argv[1])
import os
import grpc
# The generated grpc/health/v1 stubs live beside ours; grpcio owns the
# `grpc` package, so extend its path to find them.
grpc.__path__.append(os.path.join(sys.argv[1], "grpc"))
from grpc.health.v1 import health_pb2, health_pb2_grpc
host, ports = sys.argv[2], [int(p) for p in sys.argv[3:]]
checks = [(ports[0], ""), (ports[1], "")]
if ports[2]:
    checks.append((ports[2], "dedit.v1.Drafter"))
deadline = time.time() + 60
for port, service in checks:
    with grpc.insecure_channel(f"{host}:{port}") as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        while True:
            try:
                r = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=2)
                if r.status == health_pb2.HealthCheckResponse.SERVING:
                    break
            except grpc.RpcError:
                pass
            if time.time() > deadline:
                sys.exit(f"serve.sh: port {port} not SERVING")
            time.sleep(0.2)
PY
fi
echo "serve.sh: SERVING — router $HOST:$ROUTER_PORT (metrics :$ROUTER_METRICS)," \
     "target :$TARGET_PORT on $TARGET_DEVICE (metrics :$TARGET_METRICS)," \
     "$([ "$WITH_DRAFTER" = 1 ] && echo "drafter :$DRAFTER_PORT on $DRAFTER_DEVICE (metrics :$DRAFTER_METRICS)")"
echo "serve.sh: logs in $RUN_DIR"
if [ "$DETACH" = 1 ]; then
  trap - INT TERM
  exit 0
fi
wait
