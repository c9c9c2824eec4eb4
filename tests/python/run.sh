#!/usr/bin/env bash
# CTest `python`: the pytest suite of the fp4train Python package (tests/python/test_*.py)
# against the package built in BUILD_DIR/python and the CLI FP4TRAIN_BIN.
# Exit 77 (a skip) when the package was not built (FP4_PYTHON off, or no pybind11 / numpy /
# pytest). Usage: run.sh BUILD_DIR SOURCE_DIR FP4TRAIN_BIN
set -u
build=${1:?build dir} src=${2:?source dir} bin=${3:?fp4train binary}
py=${FP4_TEST_PYTHON:-/usr/bin/python3}
if ! ls "$build"/python/fp4train/_core*.so >/dev/null 2>&1; then
  echo "python: skipped: $build/python/fp4train/_core*.so not built (FP4_PYTHON off or no pybind11)"
  exit 77
fi
for mod in numpy pytest; do
  if ! "$py" -c "import $mod" >/dev/null 2>&1; then
    echo "python: skipped: $py cannot import $mod (apt-get install python3-$mod)"
    exit 77
  fi
done
export PYTHONPATH="$build/python${PYTHONPATH:+:$PYTHONPATH}"
export FP4TRAIN_BIN="$bin" FP4_SOURCE_DIR="$src" FP4_LINEAR_REF="$build/fp4_linear_ref"
# test_torch_model.py is CTest python_torch_model (it needs no compiled package).
cd "$src" && exec "$py" -m pytest -q -p no:cacheprovider --ignore=tests/python/test_torch_model.py tests/python
