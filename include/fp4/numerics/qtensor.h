// Packed FP4 tensors: two E2M1 codes per byte (even element in the low nibble), one 8-bit
// scale code per block, one FP32 tensor decode scale; saved as safetensors so Python tools
// can open them. Storage is 4.5 bits per element for block 16 (plus 4 bytes per tensor).
// Contract: docs/numerics.md "Formats" (packing) and "Quantizing one operand" (x̂ = q · c_b · gd).
#pragma once
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "fp4/numerics/block_quant.h"

namespace fp4 {

struct QTensor {
  int64_t rows = 0, cols = 0;   ///< logical shape [rows, cols], row-major
  int block = 16;               ///< block length (1-D along cols) or tile side (2-D)
  bool two_d = false;           ///< block × block tiles instead of 1 × block
  ScaleFormat scale_format = ScaleFormat::UE5M3;
  /// Block-scale rule. TensorScaled: any ScaleFormat, decode_scale = gd. MxTe / MxOcp
  /// (MXFP4): UE8M0 power-of-two scales and no tensor scale, decode_scale exactly 1.
  ScaleRule scale_rule = ScaleRule::TensorScaled;
  std::string element_format = "e2m1";
  float decode_scale = 1.f;     ///< gd = 1/ge, the tensor decode scale (1 under the MX rules)
  float reference = 0.f;        ///< tensor reference amax g that produced it
  float target = 448.f;         ///< scale target T
  std::vector<uint8_t> packed;       ///< ceil(rows·cols / 2) bytes of E2M1 codes
  std::vector<uint8_t> scale_codes;  ///< [block_rows, block_cols] scale codes
  std::map<std::string, std::string> facts;  ///< recipe facts (recipe, layer, role, gemm, ...)

  int64_t block_rows() const { return two_d ? (rows + block - 1) / block : rows; }
  int64_t block_cols() const { return (cols + block - 1) / block; }
  /// E2M1 code of row-major element i.
  uint8_t code(int64_t i) const { return (packed[i >> 1] >> ((i & 1) * 4)) & 0xF; }
  /// Bytes of codes + scale codes + the FP32 decode scale.
  int64_t storage_bytes() const;
  /// (codes + scale codes) bits per element, excluding the per-tensor FP32.
  double bits_per_element() const;
};

/// Pack an unpacked QuantizedTensor (one code per byte). Packable: E2M1 elements with a
/// block-scale format of the ScaleFormat enum under the tensor-scaled rule, or MXFP4: E2M1
/// with UE8M0 scales under mx-te / mx-ocp (and gd = 1: no tensor scale). Throws
/// std::invalid_argument on inconsistent shapes, codes above 15, or any other spec (naming
/// its element format, scale format and rule).
QTensor pack(const QuantizedTensor& q, std::map<std::string, std::string> facts = {});

/// Unpack a QTensor into `out` (one E2M1 code per byte, decoded block scales): the inverse of
/// pack() for every field a QTensor stores, so probe_gemm and other QuantizedTensor consumers
/// can take a packed operand (e.g. from quantize_pack_fast). Sets out.rows/cols, the block grid,
/// out.spec (block, two_d, scale_format, scale_rule, target; E2M1 elements, RNE: a QTensor does
/// not record the element rounding), out.g = reference, out.gd = decode_scale, out.ge =
/// (T·6)/g (1 if g = 0, at most FLT_MAX) under the tensor-scaled rule and 1 under the MX rules,
/// as quantize_blocks sets it; out.scale_codes = scale_codes, out.scales[b] =
/// scale_decode(scale_codes[b], scale_format) (the decoded c_b, after the zero-block guard),
/// out.codes[i] = code(i). out.block_amax is left EMPTY: a QTensor does not store the block
/// amaxes. out's buffers are reused (no allocation when their sizes already match). Parallel
/// over elements; bits do not depend on the thread count.
/// Throws std::invalid_argument if element_format is not "e2m1", block ≤ 0, rows or cols < 0,
/// or packed / scale_codes do not hold ceil(rows·cols / 2) / block_rows()·block_cols() bytes;
/// and what scale_decode throws for a code that is not a valid scale (naming the block).
void unpack(const QTensor& t, QuantizedTensor& out);

/// x̂ [rows, cols] = e2m1_decode(code) · (scale_decode(scale code) · decode_scale); bit-identical
/// to fp4::dequantize of the QuantizedTensor it was packed from.
void dequantize(const QTensor& t, float* out);

/// Write `t` as a safetensors file: tensors "codes" (U8 [ceil(n/2)]), "scales" (U8
/// [block_rows, block_cols]), "decode_scale" (F32 [1]; 1 for MXFP4); the layout (shape,
/// block, 2-D, formats, scale rule, reference, target, packing) and the facts in
/// "__metadata__". Atomic (temporary file, then rename). Throws fp4::UserError if the file
/// cannot be written.
void save_safetensors(const QTensor& t, const std::filesystem::path& file);

/// Read a file written by save_safetensors. A file without "scale_rule" (written before the
/// key existed) is tensor-scaled. Throws fp4::UserError naming the file and what is wrong
/// (truncated, header not JSON, missing tensor or metadata key, sizes that do not match the
/// layout, unknown format or rule names, an MX rule without ue8m0 scales or with a
/// decode_scale other than 1).
QTensor load_safetensors(const std::filesystem::path& file);

/// The bytes save_safetensors writes for `t`, in memory. A QTensor read by load_safetensors /
/// qtensor_from_bytes re-saves to the bytes it was read from when save_safetensors wrote
/// them, and any accepted file re-saves to one that reads back to the same QTensor
/// (tests/fuzz/fuzz_qtensor.cpp checks both). Throws std::invalid_argument if scale_codes does
/// not hold block_rows() × block_cols() codes.
std::string qtensor_to_bytes(const QTensor& t);

/// load_safetensors of a file already in memory (`bytes`; `name` names it in errors): the
/// same checks and errors (load_safetensors reads the file and runs the same code).
QTensor qtensor_from_bytes(std::string_view bytes, const std::string& name);

}  // namespace fp4
