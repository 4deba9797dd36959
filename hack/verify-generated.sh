#!/usr/bin/env bash
# Fail when a committed generated artifact differs from what its source generates now.
set -euo pipefail
cd "$(dirname "$0")/.."
hack/update-generated.sh
generated=(crds charts/fakefleet/files charts/fakefleet/crds federation/api)
if ! git diff --exit-code -- "${generated[@]}" || [ -n "$(git status --porcelain -- "${generated[@]}")" ]; then
  echo "generated artifacts are out of date: run 'make generate' and commit the result" >&2
  exit 1
fi
echo "generated artifacts are up to date"
