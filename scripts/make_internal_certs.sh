#!/usr/bin/env bash
# Makes the certificates of dedit's internal mTLS (docs/SERVICES.md,
# "Internal authentication"; deploy/README.md, "Internal TLS") with openssl:
#
#   OUT/ca.crt, ca.key          a private CA (keep ca.key offline)
#   OUT/stack.crt, stack.key    the stack pods' certificate, used by
#                               dedit-target and dedit-drafter as server and
#                               as client (the target streams to its drafter)
#   OUT/router.crt, router.key  the routers' client certificate
#
# The stack certificate names every way a stack is dialled: the headless
# Service (dedit-stack, .NS, .NS.svc, .NS.svc.cluster.local; the routers
# dial pod IPs and check this name with --tls_server_name=dedit-stack) and
# localhost / 127.0.0.1 / ::1 (the target dials its pod's drafter there,
# local runs dial everything there).
#
#   scripts/make_internal_certs.sh OUT [--namespace NS] [--days N]
#
# Prints the kubectl commands that load them as the Secrets the manifests
# mount (dedit-stack-tls, dedit-router-tls). Keys are EC P-256, written
# with mode 0600. Re-running replaces every file (a new CA: replace both
# Secrets and restart the pods together).
set -euo pipefail

usage() {
  echo "usage: $0 OUT_DIR [--namespace NS] [--days N]" >&2
  exit 2
}
[ $# -ge 1 ] || usage
OUT=$1
shift
NAMESPACE=dedit
DAYS=365
while [ $# -gt 0 ]; do
  case "$1" in
    --namespace) NAMESPACE=${2:?}; shift 2 ;;
    --days) DAYS=${2:?}; shift 2 ;;
    *) usage ;;
  esac
done
case "$DAYS" in '' | *[!0-9]*) echo "$0: --days must be a number" >&2; exit 2 ;; esac
command -v openssl >/dev/null || {
  echo "$0: openssl not found (apt-get install openssl)" >&2
  exit 1
}

mkdir -p "$OUT"
umask 077
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

newkey() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }

# The CA.
newkey "$OUT/ca.key"
openssl req -x509 -new -key "$OUT/ca.key" -sha256 -days "$DAYS" \
  -subj "/CN=dedit internal CA" \
  -addext "basicConstraints=critical,CA:TRUE" \
  -addext "keyUsage=critical,keyCertSign,cRLSign" \
  -out "$OUT/ca.crt"

# sign NAME CN SANS EXTENDED_KEY_USAGE
sign() {
  local name=$1 cn=$2 sans=$3 eku=$4
  newkey "$OUT/$name.key"
  openssl req -new -key "$OUT/$name.key" -subj "/CN=$cn" -out "$TMP/$name.csr"
  cat >"$TMP/$name.ext" <<EOF
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=$eku
subjectAltName=$sans
EOF
  openssl x509 -req -in "$TMP/$name.csr" -CA "$OUT/ca.crt" -CAkey "$OUT/ca.key" \
    -CAcreateserial -CAserial "$TMP/ca.srl" -sha256 -days "$DAYS" \
    -extfile "$TMP/$name.ext" -out "$OUT/$name.crt" 2>/dev/null
}

svc=dedit-stack
sign stack "$svc" \
  "DNS:$svc,DNS:$svc.$NAMESPACE,DNS:$svc.$NAMESPACE.svc,DNS:$svc.$NAMESPACE.svc.cluster.local,DNS:localhost,IP:127.0.0.1,IP:::1" \
  "serverAuth,clientAuth"
sign router dedit-router \
  "DNS:dedit-router,DNS:dedit-router.$NAMESPACE.svc,DNS:localhost" \
  "clientAuth"
chmod 0644 "$OUT/ca.crt" "$OUT/stack.crt" "$OUT/router.crt"
openssl verify -CAfile "$OUT/ca.crt" "$OUT/stack.crt" "$OUT/router.crt" >/dev/null

cat <<EOF
make_internal_certs: $OUT/{ca,stack,router}.{crt,key} (namespace $NAMESPACE, $DAYS days)
Load them as the Secrets the manifests mount:
  kubectl -n $NAMESPACE create secret generic dedit-stack-tls \\
    --from-file=ca.crt=$OUT/ca.crt --from-file=tls.crt=$OUT/stack.crt --from-file=tls.key=$OUT/stack.key
  kubectl -n $NAMESPACE create secret generic dedit-router-tls \\
    --from-file=ca.crt=$OUT/ca.crt --from-file=tls.crt=$OUT/router.crt --from-file=tls.key=$OUT/router.key
EOF
