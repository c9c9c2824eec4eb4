// Must not compile (tests/layering/backward_include.sh): a file of the nn room including a
// header of the train room, above it. fp4_nn's include directories hold only the rooms it
// links, so the header is not found.
#include "fp4/train/train.h"

int fp4_layering_probe_above() { return 0; }
