#!/bin/sh
# Regenerate the Python code of this directory's .proto files, with the codegen the e2b SDK
# itself uses: protoc-gen-py (protobuf-py) and protoc-gen-connectrpc, at the versions of the
# runtime libraries (protobuf-py 0.6.0, connectrpc 0.12.1). The tools live in their own venv:
#   python3 -m venv /tmp/codegen
#   /tmp/codegen/bin/pip install protoc-gen-py==0.6.0 protoc-gen-connectrpc==0.12.1 grpcio-tools
#   CODEGEN=/tmp/codegen sh gen.sh
set -eu
cd "$(dirname "$0")"
CODEGEN=${CODEGEN:-/tmp/codegen}
"$CODEGEN/bin/python" -m grpc_tools.protoc -I . \
  --plugin=protoc-gen-py="$CODEGEN/bin/protoc-gen-py" --py_out=. \
  --plugin=protoc-gen-connectrpc="$CODEGEN/bin/protoc-gen-connectrpc" --connectrpc_out=. \
  process.proto filesystem.proto
# The generated Connect stubs name connectrpc's generic Codec bare; that is all mypy --strict
# finds in them, so that one error code is turned off in those two files (and only there).
for f in process_connect.py filesystem_connect.py; do
  sed -i '1a # mypy: disable-error-code="type-arg"' "$f"
done
