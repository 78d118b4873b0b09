#!/usr/bin/env bash
# GPU check for the engine, run on a machine with CUDA PyTorch but no Debian
# toolchain extras: builds the engine, its tests and dedit-generate against
# the CUDA libtorch with plain g++ (no CMake needed), runs the engine tests
# on cuda, then a small speculative-vs-target-only benchmark.
#
# Needs a `.device/` folder (made by scripts/make_device_bundle.sh on a
# Debian machine) with abseil, nlohmann-json and googletest built there.
# Usage: scripts/device_check.sh OUTDIR
# A dry run on a CPU machine without PyTorch's Python package (Debian's
# libtorch; checks that this script builds):
#   DEV=cpu SKIP_BENCH=1 ABI=1 TORCH_INC=/usr/include \
#     TORCH_LIBDIR=/usr/lib/x86_64-linux-gnu scripts/device_check.sh OUTDIR
set -uo pipefail
OUT=${1:-/tmp/device_out}
mkdir -p "$OUT"
exec > >(tee "$OUT/log.txt") 2>&1
date
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
PY=$(command -v python3 || command -v python)
$PY - <<'P'
import torch, sys
print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda,
      "cxx11abi", torch._C._GLIBCXX_USE_CXX11_ABI, "gpu", torch.cuda.is_available())
P
g++ --version | head -1
ldd --version | head -1
TORCH=$($PY -c "import torch, os; print(os.path.dirname(torch.__file__))" 2>/dev/null)
ABI=${ABI:-$($PY -c "import torch; print(int(torch._C._GLIBCXX_USE_CXX11_ABI))")}
TORCH_INC=${TORCH_INC:-$TORCH/include}
TORCH_LIBDIR=${TORCH_LIBDIR:-$TORCH/lib}
DEV=${DEV:-cuda}
CUDA_LIBS=""
[ -e "$TORCH_LIBDIR/libtorch_cuda.so" ] && CUDA_LIBS="-ltorch_cuda -lc10_cuda"
ROOT=$(pwd)
B=$ROOT/build-device
mkdir -p "$B/obj"
# A response file keeps the quoted define intact through xargs/sh.
cat > "$B/cxxflags" <<F
-O2 -std=c++17 -fPIC -D_GLIBCXX_USE_CXX11_ABI=$ABI -DDEDIT_SOURCE_DIR=\\"$ROOT\\"
-I$ROOT -I$ROOT/.device/include -I$TORCH_INC -I$TORCH_INC/torch/csrc/api/include
-Wno-deprecated-declarations
F
# The libraries' sources as their CMakeLists list them (add_library(NAME
# a.cc b.cc ...)), so that this list cannot go stale.
lib_sources() {  # DIR TARGET
  awk -v t="add_library($2" 'index($0, t) == 1 {on = 1} on {
      for (i = 1; i <= NF; ++i) if ($i ~ /\.cc\)?$/) { f = $i; sub(/\)$/, "", f); print f }
      if ($0 ~ /\)/) on = 0 }' "$ROOT/$1/CMakeLists.txt" | sed "s|^|$1/|"
}
SRCS="$(lib_sources common/base dedit_base) $(lib_sources common/engine dedit_engine)
  $(lib_sources common/engine dedit_speculation_flags)
  $(lib_sources common/model dedit_model) $(lib_sources common/model dedit_cpu_flags)
  tests/model/test_util.cc tests/model/qwen3_model_test.cc tests/model/dedit_drafter_test.cc
  tests/model/sampling_test.cc tests/model/kv_pool_test.cc tests/model/torch_status_test.cc
  tests/model/cpu_kernels_test.cc tests/model/cpu_panels_test.cc tests/model/bf16_kv_cache_test.cc
  tests/engine/speculative_engine_test.cc bench/engine/engine_bench.cc
  cli/command_flags.cc cli/generate_main.cc cli/prompt_codec_ids_only.cc
  cli/make_tiny_model_main.cc"
t0=$(date +%s)
echo $SRCS | tr ' ' '\n' | grep . | xargs -P "$(nproc)" -I{} sh -c \
  "g++ @$B/cxxflags -c $ROOT/{} -o $B/obj/\$(echo {} | tr / _).o || echo BUILD_FAIL {}"
echo "compile: $(( $(date +%s) - t0 ))s"
ABSL=$(ls $ROOT/.device/lib/libabsl_*.so | sed 's|.*/lib\(absl_[a-z0-9_]*\)\.so|-l\1|' | tr '\n' ' ')
LIBS="-L$TORCH_LIBDIR -Wl,-rpath,$TORCH_LIBDIR -Wl,--no-as-needed -ltorch $CUDA_LIBS -ltorch_cpu -lc10 -Wl,--as-needed \
  -L$ROOT/.device/lib -Wl,-rpath,$ROOT/.device/lib $ABSL -lpthread -ldl"
O=$B/obj
CORE="$O/common_*.o"
# dedit-generate and the engine bench read the CPU kernel and speculation
# flags (common/model/cpu/cpu_flags.cc, common/engine/speculation_flags.cc).
g++ -o $B/dedit_engine_tests $CORE $O/tests_*.o -L$ROOT/.device/lib -lgmock -lgtest_main -lgtest $LIBS \
  || echo LINK_FAIL tests
g++ -o $B/dedit-generate $CORE $O/cli_command_flags.cc.o $O/cli_generate_main.cc.o \
  $O/cli_prompt_codec_ids_only.cc.o $LIBS || echo LINK_FAIL generate
g++ -o $B/dedit-make-tiny-model $CORE $O/cli_command_flags.cc.o $O/cli_make_tiny_model_main.cc.o $LIBS || echo LINK_FAIL make
g++ -o $B/dedit-engine-bench $CORE $O/bench_engine_engine_bench.cc.o $LIBS || echo LINK_FAIL engine-bench
echo "== engine tests on $DEV =="
DEDIT_TEST_DEVICE=$DEV timeout 300 $B/dedit_engine_tests 2>&1 | tail -45
[ -n "${SKIP_BENCH:-}" ] && exit 0
echo "== benchmark (random weights, bf16, $DEV) =="
M=/tmp/gpu-model
$B/dedit-make-tiny-model --out $M --vocab 32000 --hidden 2048 --intermediate 6144 --layers 12 \
  --heads 16 --kv_heads 8 --head_dim 128 --drafter_layers 3 --block_size 16 --dtype bfloat16 --seed 3
P='[1,5,9,200,31,77,1000,4242,17,99,3000,12,5,6]'
for args in "--ar" "--window 16 --passes 1" "--window 16 --passes 2" "--window 16 --passes 3"; do
  echo "-- $args"
  for i in 1 2; do echo "$P"; done | $B/dedit-generate --target $M/target --drafter $M/drafter \
    --device $DEV --dtype bfloat16 --json --max_tokens 128 --ignore_eos $args | tail -1 | \
    $PY -c "import json,sys; j=json.loads(sys.stdin.read()); t=j['timings']; r=j['rounds']; \
print('tok/s %.1f rounds %d tau %.3f draft/round %.2fms verify/round %.2fms' % (t['decode_tokens_per_s'], r, j['mean_acceptance_length'], 1e3*t['draft_s']/r, 1e3*t['verify_s']/r))"
done
echo "== engine efficiency (dedit-engine-bench: ops per layer, verify/decode, draft/decode, throughput by concurrency; bf16, $DEV; packed attention uses SDPA on libtorch >= 2.5) =="
$B/dedit-engine-bench --target $M/target --drafter $M/drafter --device $DEV --dtype bfloat16 \
  --concurrency 1,4,16,64 --max_tokens 64 --context 512 --reps 20 || echo BENCH_FAIL
date
