// Positive control of tests/layering/backward_include.sh: a file of the nn room (compiled with
// fp4_nn's include directories) including a header of a room below it compiles.
#include "fp4/recipe/recipe.h"

int fp4_layering_probe_below() { return 0; }
