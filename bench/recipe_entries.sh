# Recipe entries of the whole-step benchmarks (sourced by step_time.sh and throughput.sh):
# RECIPE or RECIPE@VAR=VALUE, where RECIPE is a name in configs/recipes or a recipe .toml path
# and VAR=VALUE an environment variable set for that entry's runs only, e.g.
# bf16@FP4_BF16_GEMM=blocked (docs/gemm.md "The blocked path (`FP4_BF16_GEMM=blocked`)"), so
# that two paths of one recipe are compared in one ABBA loop. The entry, as typed, labels it.
# An entry that names an existing file is a recipe path, whatever '@' it contains; otherwise the
# last '@' starts VAR=VALUE, and a recipe given as a path (with a '/' or ending in .toml) must
# exist.

# split_recipe_entry ENTRY: sets entry_recipe (the recipe) and entry_env (the VAR=VALUE to
# set, or empty).
split_recipe_entry() {
  entry_recipe=$1
  entry_env=
  if [[ ! -e $1 && $1 == *@* ]]; then
    entry_recipe=${1%@*}
    entry_env=${1##*@}
  fi
}

# check_recipe_entries PROG ENTRY...: exits 2 with a message naming the first malformed entry.
check_recipe_entries() {
  local prog=$1 r
  shift
  for r in "$@"; do
    split_recipe_entry "$r"
    # split (the recipe is not the whole entry): the recipe must be there, then VAR=VALUE
    if [[ $entry_recipe != "$r" ]] &&
      [[ -z $entry_recipe || ! $entry_env =~ ^[A-Za-z_][A-Za-z0-9_]*=.*$ ]]; then
      echo "$prog: '$r': write RECIPE@VAR=VALUE (a recipe, then an environment variable)," \
        "e.g. bf16@FP4_BF16_GEMM=blocked" >&2
      exit 2
    fi
    if [[ ($entry_recipe == */* || $entry_recipe == *.toml) && ! -f $entry_recipe ]]; then
      echo "$prog: '$r': no recipe file $entry_recipe" >&2
      exit 2
    fi
  done
}

# run_entry COMMAND [ARG...]: runs the command with split_recipe_entry's variable exported (in
# a subshell; the command is never parsed as an assignment, whatever its path).
run_entry() {
  (
    if [[ -n $entry_env ]]; then export "$entry_env"; fi
    exec "$@"
  )
}
