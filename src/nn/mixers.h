// Factories of the mixer kinds (one file each), for make_mixer (mixer.cpp).
#pragma once
#include <memory>

#include "fp4/nn/mixer.h"

namespace fp4::nn {
std::unique_ptr<Mixer> make_attention_mixer(const ModelConfig& c);
std::unique_ptr<Mixer> make_mlp_mixer(const ModelConfig& c);
std::unique_ptr<Mixer> make_mamba2_mixer(const ModelConfig& c);
}  // namespace fp4::nn

