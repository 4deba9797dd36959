#!/usr/bin/env bash
# Pin what the image installs: resolve fakefleet's runtime dependencies (not the dev tools) in a
# fresh virtualenv and write every installed version to constraints.txt, which the Dockerfile
# installs with, so that an image built later gets the same packages. Run it after changing the
# dependencies in pyproject.toml, and commit the result.
set -euo pipefail
cd "$(dirname "$0")/.."
python="${PYTHON:-python3}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$python" -m venv "$work/venv"
"$work/venv/bin/pip" install --quiet --upgrade pip
# From a copy, so that the build leaves nothing in the checkout.
mkdir "$work/src"
cp -r pyproject.toml README.md operators federation primitives "$work/src/"
"$work/venv/bin/pip" install --quiet "$work/src"
{
  echo "# The versions the image installs (pip install -c constraints.txt .): written by"
  echo "# 'make constraints' (hack/update-constraints.sh) from pyproject.toml's dependencies, with"
  echo "# $("$work/venv/bin/python" --version). Do not edit by hand."
  "$work/venv/bin/pip" freeze --exclude fakefleet
} > constraints.txt
echo "constraints.txt: $(grep -vc '^#' constraints.txt) packages pinned"
