#!/usr/bin/env bash
# E2B's own test suites, unmodified, against a live Hatchery daemon: the
# Python SDK's (e2b-dev/E2B, tag @e2b/python-sdk@2.45.1,
# packages/python-sdk/tests, sync and async, and the git-helper tests in
# tests/shared/git) and e2b-code-interpreter's (e2b-dev/code-interpreter,
# tag @e2b/code-interpreter-python@2.9.1, python/tests).
#
# A development check of issue 35's target, not part of `make test`: it
# fetches the sources and the SDKs from the internet (CI has no network).
# The tests reach only the daemon; the ones that need the public internet
# or E2B's cloud services are deselected below, each with its reason.
#
# Usage, with `make run` going (templates `base` and `code-interpreter`;
# build `base` once: `hatchery template build-local templates/base.json`;
# the interpreter suite runs on `code-interpreter-full`, built the same way
# from templates/code-interpreter-full.json):
#
#   tests/e2b/run_upstream_suite.sh [sdk|git|interpreter|all]   (default all)
#
# or against a test daemon of its own, which builds those templates on the
# test cache's rootfs (tests/e2b/with_test_daemon.py says which env it needs):
#
#   python3 tests/e2b/with_test_daemon.py --base tests/e2b/run_upstream_suite.sh
#
# Environment (all optional):
#   HATCHERY_URL      the daemon (default http://127.0.0.1:7423)
#   HATCHERY_KEY      its API key (default: /var/lib/hatchery/api_key)
#   E2B_SRC, CI_SRC   checkouts of the two repositories at those tags
#                     (default: cloned into $WORK)
#   WORK              scratch directory (default /tmp/hx-e2b-upstream)
#   PYTEST_ARGS       more pytest arguments (e.g. -x, -k ...)
#   E2B_TESTS_TEMPLATE  the interpreter suite's template (default
#                     code-interpreter-full: numpy, pandas, matplotlib,
#                     IPython and Node, as E2B's code-interpreter image)
#
# It prints pytest's summary line per suite; docs/e2b.md has the figures
# of the last run and what the remaining failures are.
set -euo pipefail

E2B_TAG='@e2b/python-sdk@2.45.1'
CI_TAG='@e2b/code-interpreter-python@2.9.1'
WORK=${WORK:-/tmp/hx-e2b-upstream}
URL=${HATCHERY_URL:-http://127.0.0.1:7423}
WHAT=${1:-all}
mkdir -p "$WORK"

# SDK 2.45.1 refuses a key that is not `e2b_` + hex before sending it; the
# daemon accepts its own key in that shape too (docs/e2b.md, Setup).
# A key of another shape (a test daemon's) is sent as is, unvalidated.
KEY=${HATCHERY_KEY:-$(cat /var/lib/hatchery/api_key)}
case $KEY in
  hx_*) export E2B_API_KEY="e2b_${KEY#hx_}" ;;
  *) export E2B_API_KEY="$KEY" E2B_VALIDATE_API_KEY=false ;;
esac
export E2B_API_URL="$URL/e2b"
export E2B_SANDBOX_URL="$URL/e2b/sandbox"
unset E2B_DOMAIN E2B_DEBUG E2B_ACCESS_TOKEN

checkout() { # repo tag dir
  if [ ! -d "$3/.git" ] && [ ! -f "$3/.hx-exported" ]; then
    git clone --quiet --depth 1 --branch "$2" "https://github.com/$1" "$3"
  fi
}
E2B_SRC=${E2B_SRC:-$WORK/E2B}
CI_SRC=${CI_SRC:-$WORK/code-interpreter}
# Only what the suites asked for is fetched (`git` needs no code-interpreter).
wants_ci() { [ "$WHAT" = interpreter ] || [ "$WHAT" = all ]; }
wants_sdk() { [ "$WHAT" != interpreter ]; }
if wants_sdk; then checkout e2b-dev/E2B "$E2B_TAG" "$E2B_SRC"; fi
if wants_ci; then checkout e2b-dev/code-interpreter "$CI_TAG" "$CI_SRC"; fi

# One venv per suite: the SDK at the tag's version with the suite's own
# test dependencies (from its pyproject's dev group).
venv() { # dir packages...
  local d=$1; shift
  if [ ! -x "$d/bin/python" ]; then
    python3 -m venv "$d"
    "$d/bin/pip" install --quiet "$@"
  fi
}
TEST_DEPS=(pytest pytest-asyncio pytest-timeout pytest-xdist pytest-dotenv python-dotenv)
if wants_sdk; then venv "$WORK/venv-sdk" "e2b==2.45.1" "${TEST_DEPS[@]}"; fi
# e2b-code-interpreter 2.9.1 allows any e2b 2.x but breaks with the newest
# (get_transport changed): the SDK release of the same time.
if wants_ci; then venv "$WORK/venv-ci" "e2b-code-interpreter==2.9.1" "e2b==2.45.1" "${TEST_DEPS[@]}"; fi

# --- Deselected: public internet or E2B's cloud services, never Hatchery's
# behaviour. Paths are relative to the suite's directory.
SDK_IGNORE=(
  # E2B's volumes service (a cloud API Hatchery does not have).
  tests/sync/volume_sync tests/async/volume_async
  # E2B's secrets service.
  tests/sync/secret_sync tests/async/secret_async
  # E2B's template build service (templates are built with Hatchery's /v1/templates).
  tests/sync/template_sync tests/async/template_async
  # Public internet: curl to connectivitycheck.gstatic.com.
  tests/sync/sandbox_sync/test_internet_access.py tests/async/sandbox_async/test_internet_access.py
  # E2B's public edge: get_host() URLs on *.e2b.app over HTTPS and wildcard DNS.
  tests/sync/sandbox_sync/test_host.py tests/async/sandbox_async/test_host.py
)
SDK_DESELECT=()
for m in sync/sandbox_sync async/sandbox_async; do
  f=tests/$m/test_network.py
  SDK_DESELECT+=(
    # Public internet: allow/deny rules checked against public IPs and sites.
    "$f::test_allow_specific_ip_with_deny_all" "$f::test_deny_specific_ip" "$f::test_deny_all_traffic"
    "$f::test_allow_takes_precedence_over_deny" "$f::test_update_network_applies_restrictions"
    "$f::test_update_network_clears_existing_rules"
    # E2B's public edge (get_host URLs, traffic tokens, request host masking).
    "$f::test_allow_public_traffic_false" "$f::test_allow_public_traffic_true" "$f::test_mask_request_host"
    # E2B's hosted httpbin template and egress proxy (header transforms).
    "$f::test_firewall_transform_injects_headers"
  )
  f=tests/$m/test_create.py
  SDK_DESELECT+=(
    # E2B's public edge: wakes the sandbox through an https get_host() URL.
    "$f::test_auto_resume_wakes_on_http_request"
    # E2B's MCP gateway.
    "$f::test_mcp_gateway_start_failure_kills_created_sandbox"
  )
done
# None in the interpreter suite: all of its tests reach only the sandbox.
# Its failures on Hatchery (docs/e2b.md) are R and Java kernels (none here)
# and E2B's systemd services (test_systemd: curl to the interpreter on
# 0.0.0.0:49999 inside the sandbox; Hatchery's is served by the daemon).
CI_IGNORE=()
CI_DESELECT=()
export E2B_TESTS_TEMPLATE=${E2B_TESTS_TEMPLATE:-code-interpreter-full}

run() { # venv dir suite-name args...
  local py=$1/bin/python dir=$2 name=$3 log
  shift 3
  log="$WORK/$(echo "$name" | tr ' ' '-').log"
  echo "== $name (full output: $log)"
  (cd "$dir" && "$py" -m pytest -q -p no:cacheprovider -rfE --timeout 120 "$@" ${PYTEST_ARGS:-} >"$log" 2>&1) || true
  grep -E '^(FAILED|ERROR) ' "$log" | cut -c1-160 || true
  tail -1 "$log"
}

args() { # prefix ignore-array-name deselect-array-name
  local -n ig=$2 de=$3
  local a=()
  for p in "${ig[@]}"; do a+=(--ignore "$p"); done
  for p in "${de[@]}"; do a+=(--deselect "$p"); done
  if [ ${#a[@]} -gt 0 ]; then printf '%s\n' "${a[@]}"; fi
}

if [ "$WHAT" = sdk ] || [ "$WHAT" = all ]; then
  mapfile -t A < <(args sdk SDK_IGNORE SDK_DESELECT)
  run "$WORK/venv-sdk" "$E2B_SRC/packages/python-sdk" "python-sdk sync" "${A[@]}" tests/sync
  run "$WORK/venv-sdk" "$E2B_SRC/packages/python-sdk" "python-sdk async" "${A[@]}" tests/async
fi
if [ "$WHAT" = git ] || [ "$WHAT" = all ]; then
  run "$WORK/venv-sdk" "$E2B_SRC/packages/python-sdk" "python-sdk git helpers" tests/shared/git
fi
if [ "$WHAT" = interpreter ] || [ "$WHAT" = all ]; then
  mapfile -t A < <(args ci CI_IGNORE CI_DESELECT)
  run "$WORK/venv-ci" "$CI_SRC/python" "code-interpreter" "${A[@]}" tests
fi
