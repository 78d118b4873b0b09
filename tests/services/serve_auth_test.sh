#!/usr/bin/env bash
# services.serve_auth: scripts/serve.sh's default is internal token mode.
# Over the bundled pair it writes RUN_DIR/internal.token (mode 0600); the
# target and the drafter refuse a call without it (UNAUTHENTICATED) and
# answer one with it; the router's public port needs none, and the router
# reaches both (its drafter is healthy). With --insecure-internal the
# target answers without a token.
#   serve_auth_test.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
ROOT=$1
BUILD=$2
STUBS=$(find "$BUILD" -type d -path '*proto/python' | head -1)
RUN=$(mktemp -d "${TMPDIR:-/tmp}/dedit-serve-auth.XXXXXX")
cleanup() {
  for f in "$RUN"/*/*.pid; do
    [ -f "$f" ] && kill -TERM "$(cat "$f")" 2>/dev/null || true
  done
  sleep 1
  rm -rf "$RUN"
}
trap cleanup EXIT
read -r R T D M1 M2 M3 R2 T2 M4 M5 < <(python3 "$ROOT/scripts/free_ports.py" 10)
bash "$ROOT/scripts/serve.sh" --build-dir "$BUILD" --run-dir "$RUN/secure" \
  --detach --threads 1 --target-dir "$ROOT/checkpoints/tiny/target" \
  --drafter-dir "$ROOT/checkpoints/tiny/drafter" --router-port "$R" \
  --target-port "$T" --drafter-port "$D" --metrics-ports "$M1,$M2,$M3" >/dev/null
bash "$ROOT/scripts/serve.sh" --build-dir "$BUILD" --run-dir "$RUN/insecure" \
  --detach --threads 1 --target-dir "$ROOT/checkpoints/tiny/target" \
  --no-drafter --insecure-internal --router-port "$R2" --target-port "$T2" \
  --metrics-ports "$M4,$M5,0" >/dev/null
mode=$(stat -c %a "$RUN/secure/internal.token")
if [ "$mode" != 600 ]; then
  echo "FAIL: internal.token has mode $mode, not 600"
  exit 1
fi
[ ! -e "$RUN/insecure/internal.token" ] || { echo "FAIL: insecure run wrote a token"; exit 1; }
/usr/bin/python3 - "$STUBS" "$RUN/secure/internal.token" "$R" "$T" "$D" "$T2" <<'PY'
import os
import sys
sys.path.insert(0, sys.argv[1])
import grpc
from dedit.v1 import drafter_pb2, generation_pb2, services_pb2_grpc, target_pb2
token = open(sys.argv[2]).read().strip()
router, target, drafter, open_target = (f"127.0.0.1:{p}" for p in sys.argv[3:7])
failures = []


def call(what, method, request, metadata=None, want=grpc.StatusCode.OK):
    try:
        method(request, timeout=10, metadata=metadata)
        code = grpc.StatusCode.OK
    except grpc.RpcError as e:
        code = e.code()
    print(f"{what}: {code.name}")
    if code != want:
        failures.append(f"{what}: {code.name}, expected {want.name}")


bearer = [("authorization", f"Bearer {token}")]
t = services_pb2_grpc.TargetStub(grpc.insecure_channel(target))
d = services_pb2_grpc.DrafterStub(grpc.insecure_channel(drafter))
call("Target.Info without a token", t.Info, target_pb2.TargetInfoRequest(),
     want=grpc.StatusCode.UNAUTHENTICATED)
call("Target.Info with a wrong token", t.Info, target_pb2.TargetInfoRequest(),
     [("authorization", "Bearer " + "x" * len(token))],
     want=grpc.StatusCode.UNAUTHENTICATED)
call("Drafter.Info without a token", d.Info, drafter_pb2.DrafterInfoRequest(),
     want=grpc.StatusCode.UNAUTHENTICATED)
call("Target.Info with the token", t.Info, target_pb2.TargetInfoRequest(),
     bearer)
call("Drafter.Info with the token", d.Info, drafter_pb2.DrafterInfoRequest(),
     bearer)
g = services_pb2_grpc.GenerationStub(grpc.insecure_channel(router))
info = g.Info(generation_pb2.RouterInfoRequest(), timeout=10)
print("router: drafter healthy", info.drafter_healthy)
if not info.drafter_healthy:
    failures.append("the router does not reach its drafter")
req = generation_pb2.GenerateRequest(max_tokens=8, ignore_eos=True)
req.token_ids.ids.extend([1, 2, 3])
tokens = sum(len(r.token_ids) for r in g.Generate(req, timeout=30))
print("router generated", tokens, "tokens")
if tokens != 8:
    failures.append(f"router generated {tokens} tokens, not 8")
o = services_pb2_grpc.TargetStub(grpc.insecure_channel(open_target))
call("--insecure-internal Target.Info without a token", o.Info,
     target_pb2.TargetInfoRequest())
for f in failures:
    print("FAIL:", f)
sys.exit(1 if failures else 0)
PY
echo ok
