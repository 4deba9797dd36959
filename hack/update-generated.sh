#!/usr/bin/env bash
# Regenerate every committed artifact from its source.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m operators.api.crdgen crds
