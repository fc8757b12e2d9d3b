#!/usr/bin/env bash
# The Array API standard's test suite (github.com/data-apis/array-api-tests) against
# hybrid.array_api. A documented command, not part of CI: hypothesis draws many arrays and
# each eager op goes through the engine, so a run takes minutes.
#
#   ARRAY_API_TESTS_DIR=/path/to/array-api-tests bash benchmarks/array_api_suite.sh [pytest args]
#
# The checkout needs its 'array-api' submodule (the spec's signatures) filled in
# (git submodule update --init, or clone github.com/data-apis/array-api into
# array-api-tests/array-api). It also needs: pip install hypothesis ndindex pytest-json-report
#
# Settings, each overridable: MAX_EXAMPLES (hypothesis examples per test, default 20),
# DISABLE (extensions not run, default "linalg fft": hybrid has neither), TESTS (files or
# node ids, default the whole array_api_tests/), TAIL (lines of output kept). hybrid has no
# complex dtypes, so complex64/complex128 are skipped through the suite's own
# ARRAY_API_TESTS_SKIP_DTYPES, and the one line of the suite that assumes a complex dtype
# exists (widest_complex_dtype) is given a default in the checkout (idempotent);
# test_signatures.py is not collected, since building its inputs needs a complex dtype.
# Hypothesis draws afresh each run, so the count can move by a few between runs (a rare
# input found or missed). The last lines printed are pytest's summary: the pass count
# recorded in README.md.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
suite="${ARRAY_API_TESTS_DIR:?set ARRAY_API_TESTS_DIR to a checkout of data-apis/array-api-tests}"
[ -d "$suite/array_api_tests" ] || { echo "no array_api_tests/ in $suite" >&2; exit 2; }
[ -d "$suite/array-api/spec" ] || {
    echo "$suite/array-api is empty: fill the submodule (see the top of this script)" >&2
    exit 2
}

python - "$suite/array_api_tests/dtype_helpers.py" <<'PY'
import sys
path = sys.argv[1]
src = open(path).read()
old = "[(dt, dtype_nbits[dt]) for dt in complex_dtypes], key=lambda x: x[1]\n)[0]"
new = ("[(dt, dtype_nbits[dt]) for dt in complex_dtypes], key=lambda x: x[1],\n"
       "    default=(None, 0))[0]")
if old in src:
    open(path, "w").write(src.replace(old, new))
PY

cd "$suite"
export PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}"
export ARRAY_API_TESTS_MODULE=hybrid.array_api
export ARRAY_API_TESTS_SKIP_DTYPES=complex64,complex128
# shellcheck disable=SC2086 - DISABLE and TESTS are lists of words
python -m pytest -q -p no:cacheprovider --max-examples="${MAX_EXAMPLES:-20}" \
    --disable-deadline --disable-extension ${DISABLE:-linalg fft} \
    --ignore=array_api_tests/test_signatures.py \
    -o addopts="" "$@" ${TESTS:-array_api_tests/} 2>&1 | tail -n "${TAIL:-40}"
