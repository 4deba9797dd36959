#!/usr/bin/env bash
# Regenerate every committed artifact from its source: CRD YAML from operators/api (crds/, and
# the chart's copy: Helm installs what is in the chart), the chart's RBAC rules from
# operators/handlers/permissions.py, and the protobuf/gRPC stubs (with type stubs) under
# federation/api from proto/.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m operators.api.crdgen crds
python -m operators.api.crdgen charts/fakefleet/crds
python -m operators.handlers.permissions charts/fakefleet/files >/dev/null
wellknown="$(python -c 'import grpc_tools, os; print(os.path.join(os.path.dirname(grpc_tools.__file__), "_proto"))')"
rm -f federation/api/*_pb2.py federation/api/*_pb2.pyi federation/api/*_pb2_grpc.py \
  federation/api/*_pb2_grpc.pyi
python -m grpc_tools.protoc -I proto -I "$wellknown" \
  --python_out=. --grpc_python_out=. --mypy_out=. --mypy_grpc_out=. \
  proto/federation/api/*.proto
