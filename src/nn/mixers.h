// The built-in mixer kinds' registry entries (one file each), for mixer.cpp's registry.
#pragma once
#include "fp4/nn/mixer.h"

namespace fp4::nn {
MixerKind mamba2_mixer_kind();     // mixer_mamba2.cpp
MixerKind attention_mixer_kind();  // mixer_attention.cpp
MixerKind mlp_mixer_kind();        // mixer_mlp.cpp
}  // namespace fp4::nn
