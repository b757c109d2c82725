#!/bin/sh
# ci_doc.sh: the GitHub Actions and GitLab CI jobs of docs/ci.md, run
# against this checkout (tests/e2e/ci_doc.py): on main they pass and leave
# the baseline; a pull request with nothing changed passes against it; one
# whose vjp checks regressed against the baseline fails the job, on both.
. "$(dirname "$0")/lib.inc"
$PY -c "import yaml" 2>/dev/null || { echo "PyYAML missing (scripts/install-deps.sh installs python3-yaml)"; exit 77; }
$PY "$(dirname "$0")/ci_doc.py" docs/ci.md "$T" || bad "the CI jobs of docs/ci.md"
finish
