// make_mixer: pattern character → mixer kind (fp4/nn/mixer.h).
#include "fp4/nn/mixer.h"

#include "fp4/base/error.h"
#include "mixers.h"

namespace fp4::nn {

void Mixer::init_param(size_t i, float* w, std::mt19937_64& rng) const {
  (void)i, (void)w, (void)rng;
  throw std::logic_error("Mixer::init_param: the mixer declared a kCustom parameter but has no "
                         "initialiser for it");
}

std::unique_ptr<Mixer> make_mixer(char symbol, const ModelConfig& cfg) {
  switch (symbol) {
    case '*': return make_attention_mixer(cfg);
    case '-': return make_mlp_mixer(cfg);
    case 'M': return make_mamba2_mixer(cfg);
  }
  throw UserError(std::string("model.pattern: unknown block character '") + symbol +
                  "' (expected 'M' Mamba-2, '*' attention or '-' MLP)");
}

int64_t block_param_count(char symbol, const ModelConfig& cfg) {
  const std::unique_ptr<Mixer> m = make_mixer(symbol, cfg);
  int64_t n = cfg.d_model;  // the block's RMSNorm weight
  for (const MixerParam& p : m->params()) n += p.rows * p.cols;
  for (const MixerLinear& l : m->linears()) n += l.in * l.out;
  return n;
}

}  // namespace fp4::nn
