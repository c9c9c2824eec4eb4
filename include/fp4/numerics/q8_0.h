// llama.cpp's Q8_0 activation quantization, as its CPU backend applies it to the activations of
// every matmul with quantized (here MXFP4 or NVFP4) weights (ggml-cpu, type_traits
// vec_dot_type = GGML_TYPE_Q8_0), for `fp4train eval --policy llama-q8_0`: the NLL llama.cpp
// computes of a GGUF export, in fp4train (docs/export.md "FP4 weights in GGUF").
#pragma once
#include <cstdint>

namespace fp4 {

/// x rounded to the nearest IEEE binary16 value (RNE; subnormals kept; beyond 65504 + 16 to
/// ±Inf; NaN stays NaN), returned as FP32: what F16C's vcvtps2ph with rounding mode 0 (and so
/// ggml's GGML_CPU_FP32_TO_FP16 on x86) gives.
float round_fp16(float x);

/// Q8_0 quantize → dequantize of x [rows, cols] (row-major FP32) into out (may alias x), in
/// blocks of 32 along each row, as ggml-cpu's x86 quantize_row_q8_0 (its AVX/AVX2 body) does:
/// amax = max |x| of the block; d = round_fp16(amax / 127); id = amax ≠ 0 ? 127 / amax : 0;
/// q = x·id (FP32 product) rounded to the nearest integer, ties to even (|q| ≤ 127); out =
/// q·d. (ggml's portable reference quantize_row_q8_0_ref differs: id = 1/d and ties away from
/// zero.) Throws std::invalid_argument if cols is not a positive multiple of 32 or rows < 0,
/// and for a non-finite x (naming its index).
void q8_0_quantize_dequantize(const float* x, int64_t rows, int64_t cols, float* out);

}  // namespace fp4
