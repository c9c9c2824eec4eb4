// 'M' blocks: the Mamba-2 mixer (placeholder until the SSD kernels land).
#include "fp4/error.h"
#include "mixers.h"

namespace fp4::nn {
std::unique_ptr<Mixer> make_mamba2_mixer(const ModelConfig&) {
  throw UserError("model.pattern: Mamba-2 blocks ('M') are not built yet");
}
}  // namespace fp4::nn
