# Shared by the CLI test scripts (sourced, not a test itself: tests/cli/*.sh are the tests).
# Expects $bin (the fp4train binary) and $src (the source dir) to be set by the script.

fail() { echo "FAIL: $*"; exit 1; }

# expect_error <substring> <args...>: fp4train exits non-zero with the substring on stderr.
expect_error() {
  local want=$1; shift
  local err
  if err=$("$bin" "$@" 2>&1 >/dev/null); then fail "expected failure for: $*"; fi
  grep -qF -- "$want" <<<"$err" || fail "message for '$*' lacks '$want': $err"
}

# micro_setup WORK [key=value ...]: copies the first `docs` Brown documents to WORK/text and
# writes WORK/micro.toml, a micro model (d_model 32, 2 layers) reading WORK/text with its token
# cache in WORK/cache. Keys and defaults: docs=40 vocab_size=512 batch_size=4 steps=40
# lr=1e-2 warmup_steps=4 interval=20 windows=8 progress_seconds=0.0 telemetry_interval=10.
micro_setup() {
  local work=$1; shift
  local docs=40 vocab_size=512 batch_size=4 steps=40 lr=1e-2 warmup_steps=4 interval=20
  local windows=8 progress_seconds=0.0 telemetry_interval=10 kv
  for kv in "$@"; do
    case "${kv%%=*}" in
      docs|vocab_size|batch_size|steps|lr|warmup_steps|interval|windows|progress_seconds|telemetry_interval)
        local "$kv" ;;
      *) fail "micro_setup: unknown key ${kv%%=*}" ;;
    esac
  done
  local brown="$src/data/brown/text"
  [ -d "$brown" ] || fail "default corpus missing at $brown (scripts/setup installs it)"
  mkdir -p "$work/text"
  ls "$brown"/*.txt | head -"$docs" | xargs -I{} cp {} "$work/text/"
  cat > "$work/micro.toml" <<TOML
[model]
vocab_size = $vocab_size
d_model = 32
n_layers = 2
n_heads = 2
mlp_hidden = 64
[train]
seq_len = 32
batch_size = $batch_size
steps = $steps
lr = $lr
warmup_steps = $warmup_steps
[data]
path = "$work/text"
cache = "$work/cache"
[eval]
interval = $interval
windows = $windows
[log]
progress_seconds = $progress_seconds
telemetry_interval = $telemetry_interval
TOML
}

# require_mpi: exit 77 (skip) unless mpirun is on PATH and $bin links Open MPI; then sets `mpi`,
# the mpirun prefix of the MPI tests (any user, more ranks than cores, no pinning).
require_mpi() {
  command -v mpirun > /dev/null || { echo "SKIP: mpirun not found (scripts/setup installs openmpi-bin)"; exit 77; }
  # (not grep -q: under pipefail, ldd dying of SIGPIPE would read as "no MPI")
  ldd "$bin" | grep libmpi > /dev/null || { echo "SKIP: $bin was built without MPI (configure with Open MPI installed)"; exit 77; }
  mpi=(mpirun --allow-run-as-root --oversubscribe --bind-to none)
}
