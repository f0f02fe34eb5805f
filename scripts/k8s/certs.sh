#!/usr/bin/env bash
# Generates everything a loopback control plane needs into DIR (openssl only):
#   ca.{crt,key}              cluster CA: signs serving certs; --client-ca-file; --peer-ca-file (built-in MVP)
#   apiserver.{crt,key}       serving cert of every kube-apiserver and of the test aggregated API backend.
#                             SANs: kubernetes.default.svc (the SNI Envoy and the built-in MVP use),
#                             kubernetes.default, kubernetes, localhost, 127.0.0.1, 198.18.0.11-19 (the
#                             node addresses of kpp.testing.netns), and the aggregated
#                             backend's service name kpp-wardle.kpp-system.svc
#   front-proxy-ca.{crt,key}  --requestheader-client-ca-file (aggregator and built-in MVP identity headers)
#   front-proxy-client.{crt,key}  --proxy-client-cert-file/--proxy-client-key-file, CN=front-proxy-client
#   sa.{key,pub}              service account signing key pair
#   tokens.csv                static bearer tokens (--token-auth-file), see below
# Idempotent: does nothing if DIR/ca.crt already exists.
set -euo pipefail
DIR="${1:?usage: certs.sh DIR}"
[[ -f "$DIR/tokens.csv" ]] && exit 0
mkdir -p "$DIR"
cd "$DIR"
DAYS=30
q() { openssl "$@" 2>/dev/null; }

q req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days "$DAYS" -subj "/CN=kpp-test-ca"
q req -x509 -newkey rsa:2048 -nodes -keyout front-proxy-ca.key -out front-proxy-ca.crt -days "$DAYS" \
    -subj "/CN=kpp-test-front-proxy-ca"

cat > apiserver.ext <<EXT
basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,DNS:kubernetes.default,DNS:kubernetes,DNS:localhost,DNS:kpp-wardle.kpp-system.svc,IP:127.0.0.1,IP:198.18.0.11,IP:198.18.0.12,IP:198.18.0.13,IP:198.18.0.14,IP:198.18.0.15,IP:198.18.0.16,IP:198.18.0.17,IP:198.18.0.18,IP:198.18.0.19
EXT
q req -newkey rsa:2048 -nodes -keyout apiserver.key -out apiserver.csr -subj "/CN=kube-apiserver"
q x509 -req -in apiserver.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out apiserver.crt -days "$DAYS" \
    -extfile apiserver.ext

cat > client.ext <<EXT
basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth
EXT
q req -newkey rsa:2048 -nodes -keyout front-proxy-client.key -out front-proxy-client.csr -subj "/CN=front-proxy-client"
q x509 -req -in front-proxy-client.csr -CA front-proxy-ca.crt -CAkey front-proxy-ca.key -CAcreateserial \
    -out front-proxy-client.crt -days "$DAYS" -extfile client.ext

q genrsa -out sa.key 2048
q rsa -in sa.key -pubout -out sa.pub

tok() { openssl rand -hex 16; }
# token,user,uid,"groups": admin is cluster-admin; kpp-discovery only has what system:discovery gives every
# authenticated user (GET /api, /api/*, /apis, /apis/*); alice gets namespaced rights from tests' RBAC.
{
    echo "$(tok),kpp-admin,kpp-admin,\"system:masters\""
    echo "$(tok),kpp-discovery,kpp-discovery,\"kpp:discovery\""
    echo "$(tok),alice,alice,\"kpp:testers\""
} > tokens.csv
rm -f ./*.csr ./*.ext ./*.srl
chmod 600 ./*.key tokens.csv
