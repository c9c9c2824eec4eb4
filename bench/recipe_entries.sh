# Recipe entries of the whole-step benchmarks (sourced by step_time.sh and throughput.sh):
# RECIPE or RECIPE@VAR=VALUE, where RECIPE is a name in configs/recipes or a recipe .toml path
# and VAR=VALUE an environment variable set for that entry's runs only, e.g.
# bf16@FP4_BF16_GEMM=blocked (docs/gemm.md "The blocked path (`FP4_BF16_GEMM=blocked`)"), so
# that two paths of one recipe are compared in one ABBA loop. The entry, as typed, labels it.

# check_recipe_entries PROG ENTRY...: exits 2 with a message naming the first malformed entry.
check_recipe_entries() {
  local prog=$1 r
  shift
  for r in "$@"; do
    if [[ $r == *@* && ! ${r#*@} =~ ^[A-Za-z_][A-Za-z0-9_]*=.*$ ]]; then
      echo "$prog: '$r': after @ comes VAR=VALUE (an environment variable), e.g." \
        "bf16@FP4_BF16_GEMM=blocked" >&2
      exit 2
    fi
  done
}

# split_recipe_entry ENTRY: sets entry_recipe (the recipe) and entry_env (an array: the
# VAR=VALUE to pass to env, or nothing).
split_recipe_entry() {
  entry_recipe=$1
  entry_env=()
  if [[ $1 == *@* ]]; then
    entry_recipe=${1%%@*}
    entry_env=("${1#*@}")
  fi
}
