#!/usr/bin/env bash
# Regenerate the Python gRPC stubs in shared/grpc/ from every proto/*.proto, or only from
# the proto files given as arguments: scripts/gen_protos.sh [proto/x.proto ...]
# protoc emits `import x_pb2` (top-level); rewrite it to a package import so the stubs
# load as shared.grpc.x_pb2_grpc.
set -euo pipefail
cd "$(dirname "$0")/.."

# The project venv has grpcio-tools (dev extra); fall back to whatever python is on PATH.
if [ -x .venv/bin/python ]; then PYTHON="${PYTHON:-.venv/bin/python}"; else PYTHON="${PYTHON:-python3}"; fi
OUT=shared/grpc
mkdir -p "$OUT"
[ -f "$OUT/__init__.py" ] || echo '"""Generated gRPC stubs (scripts/gen_protos.sh); do not edit."""' > "$OUT/__init__.py"

shopt -s nullglob
if [ $# -gt 0 ]; then protos=("$@"); else protos=(proto/*.proto); fi
if [ ${#protos[@]} -eq 0 ]; then
  echo "no proto/*.proto files" >&2
  exit 1
fi

for proto in "${protos[@]}"; do
  name="$(basename "$proto" .proto)"
  "$PYTHON" -m grpc_tools.protoc -Iproto \
    --python_out="$OUT" --grpc_python_out="$OUT" --pyi_out="$OUT" "$proto"
  sed -i -E "s/^import ${name}_pb2 as /from shared.grpc import ${name}_pb2 as /" \
    "$OUT/${name}_pb2_grpc.py"
  echo "generated $OUT/${name}_pb2{,_grpc}.py{,i} from $proto"
done
