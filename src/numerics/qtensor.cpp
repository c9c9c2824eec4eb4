// Packed FP4 tensors and their safetensors files.
#include "fp4/numerics/qtensor.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cfloat>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "fp4/base/error.h"
#include "fp4/base/safetensors.h"

namespace fp4 {
namespace fs = std::filesystem;
using json = nlohmann::json;

int64_t QTensor::storage_bytes() const {
  return static_cast<int64_t>(packed.size() + scale_codes.size()) + 4;
}

double QTensor::bits_per_element() const {
  const int64_t n = rows * cols;
  return n == 0 ? 0.0 : 8.0 * double(packed.size() + scale_codes.size()) / double(n);
}

QTensor pack(const QuantizedTensor& q, std::map<std::string, std::string> facts) {
  const int64_t n = q.rows * q.cols;
  const bool mx = q.spec.scale_rule != ScaleRule::TensorScaled;
  if (!q.spec.element.is_e2m1() || q.spec.scale_desc != nullptr ||
      (mx && (q.spec.scale_format != ScaleFormat::UE8M0 || q.gd != 1.0f)))
    throw std::invalid_argument(
        "pack: QTensor holds E2M1 elements with tensor-scaled ue5m3/ue5m3-ptx/e4m3/ue8m0 block "
        "scales, or MXFP4 (ue8m0 scales under mx-te/mx-ocp, no tensor scale); got element " +
        q.spec.element.name() + ", scale " + spec_scale_format(q.spec).name + ", scale rule " +
        scale_rule_name(q.spec.scale_rule) + (mx && q.gd != 1.0f ? ", a tensor scale" : ""));
  if (!q.row_gd.empty())
    throw std::invalid_argument("pack: a QTensor holds one tensor scale; a row-scaled "
                                "QuantizedTensor (one reference per row) cannot be packed");
  if (q.codes.size() != static_cast<size_t>(n) ||
      q.scales.size() != static_cast<size_t>(q.block_rows * q.block_cols))
    throw std::invalid_argument("pack: inconsistent QuantizedTensor shapes");
  QTensor t;
  t.rows = q.rows;
  t.cols = q.cols;
  t.block = q.spec.block;
  t.two_d = q.spec.two_d;
  t.scale_format = q.spec.scale_format;
  t.scale_rule = q.spec.scale_rule;
  t.decode_scale = q.gd;
  t.reference = q.g;
  t.target = q.spec.target;
  t.facts = std::move(facts);
  t.packed.assign(static_cast<size_t>((n + 1) / 2), 0);
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t c = q.codes[static_cast<size_t>(i)];
    if (c > 15) throw std::invalid_argument("pack: code above 15 at element " + std::to_string(i));
    t.packed[static_cast<size_t>(i >> 1)] |= static_cast<uint8_t>(c << ((i & 1) * 4));
  }
  t.scale_codes.resize(q.scales.size());
  for (size_t b = 0; b < q.scales.size(); ++b)
    t.scale_codes[b] = scale_encode(q.scales[b], q.spec.scale_format);
  return t;
}

void unpack(const QTensor& t, QuantizedTensor& out) {
  const std::string w = "unpack";
  if (t.element_format != "e2m1")
    throw std::invalid_argument(w + ": element format '" + t.element_format + "' is not e2m1");
  if (t.block <= 0 || t.rows < 0 || t.cols < 0)
    throw std::invalid_argument(w + ": invalid layout (rows " + std::to_string(t.rows) + ", cols " +
                                std::to_string(t.cols) + ", block " + std::to_string(t.block) + ")");
  const int64_t n = t.rows * t.cols, nb = t.block_rows() * t.block_cols();
  if (t.packed.size() != static_cast<size_t>((n + 1) / 2) ||
      t.scale_codes.size() != static_cast<size_t>(nb)) {
    throw std::invalid_argument(w + ": " + std::to_string(t.packed.size()) + " packed bytes and " +
                                std::to_string(t.scale_codes.size()) + " scale codes for a [" +
                                std::to_string(t.rows) + ", " + std::to_string(t.cols) +
                                "] tensor with " + std::to_string(nb) + " blocks (expected " +
                                std::to_string((n + 1) / 2) + " and " + std::to_string(nb) + ")");
  }
  out.rows = t.rows;
  out.cols = t.cols;
  out.spec = BlockQuantSpec{};
  out.spec.block = t.block;
  out.spec.two_d = t.two_d;
  out.spec.scale_format = t.scale_format;
  out.spec.scale_rule = t.scale_rule;
  out.spec.target = t.target;
  out.g = t.reference;
  out.gd = t.decode_scale;
  if (t.scale_rule != ScaleRule::TensorScaled || t.reference == 0.0f) out.ge = 1.0f;
  else out.ge = std::min((t.target * 6.0f) / t.reference, FLT_MAX);
  out.block_rows = t.block_rows();
  out.block_cols = t.block_cols();
  out.block_amax.clear();
  out.scale_codes = t.scale_codes;
  out.scales.resize(static_cast<size_t>(nb));
  // Decode each distinct code once (a table filled on first use): scale_decode throws for
  // codes that are not scales, naming the first such block.
  std::array<float, 256> table{};
  std::array<bool, 256> known{};
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t c = t.scale_codes[static_cast<size_t>(b)];
    if (!known[c]) {
      try {
        table[c] = scale_decode(c, t.scale_format);
      } catch (const std::exception& e) {
        throw std::invalid_argument(w + ": block " + std::to_string(b) + ": " + e.what());
      }
      known[c] = true;
    }
    out.scales[static_cast<size_t>(b)] = table[c];
  }
  out.codes.resize(static_cast<size_t>(n));
  const uint8_t* p = t.packed.data();
  uint8_t* q = out.codes.data();
  const int64_t pairs = n / 2;
  // Byte j holds codes 2j (low nibble) and 2j + 1 (high nibble): one 16-bit value of both,
  // the first code in the low byte (x86-64 is little-endian), in a loop GCC vectorises.
  static_assert(std::endian::native == std::endian::little);
  constexpr int64_t kRun = 4096;  // pairs per work item
#pragma omp parallel for schedule(static) if (n >= (1 << 18))
  for (int64_t j0 = 0; j0 < pairs; j0 += kRun) {
    const int64_t len = std::min(kRun, pairs - j0);
    const uint8_t* __restrict src = p + j0;
    using U16 = uint16_t __attribute__((may_alias));  // stores into the uint8_t codes
    U16* __restrict dst = reinterpret_cast<U16*>(q + 2 * j0);
#pragma omp simd
    for (int64_t j = 0; j < len; ++j)
      dst[j] = static_cast<uint16_t>((src[j] & 15u) | (unsigned(src[j] >> 4) << 8));
  }
  if (n % 2) q[n - 1] = p[pairs] & 15;
}

void dequantize(const QTensor& t, float* out) {
  const int64_t bc = t.block_cols();
  std::vector<float> d(t.scale_codes.size());
  for (size_t b = 0; b < d.size(); ++b) d[b] = scale_decode(t.scale_codes[b], t.scale_format) * t.decode_scale;
#pragma omp parallel for schedule(static) if (t.rows * t.cols >= (1 << 16))
  for (int64_t r = 0; r < t.rows; ++r) {
    const int64_t br = t.two_d ? r / t.block : r;
    for (int64_t c = 0; c < t.cols; ++c) {
      const int64_t i = r * t.cols + c;
      out[i] = e2m1_decode(t.code(i)) * d[static_cast<size_t>(br * bc + c / t.block)];
    }
  }
}

namespace {
// Shortest-enough decimal that reads back to the same float (%.9g round-trips FP32).
std::string float_repr(float f) {
  char b[48];
  std::snprintf(b, sizeof b, "%.9g", static_cast<double>(f));
  return b;
}
}  // namespace

namespace {
// The header and tensors of t's file, for save_safetensors and qtensor_to_bytes.
json qtensor_header(const QTensor& t, std::vector<safetensors::TensorOut>& tensors) {
  const int64_t n_codes = static_cast<int64_t>(t.packed.size());
  const int64_t n_scales = static_cast<int64_t>(t.scale_codes.size());
  json meta = {{"format", "fp4train.qtensor.v1"},
               {"rows", std::to_string(t.rows)},
               {"cols", std::to_string(t.cols)},
               {"block", std::to_string(t.block)},
               {"layout", t.two_d ? "2d-tile" : "1d-row"},
               {"element_format", t.element_format},
               {"scale_format", scale_format_name(t.scale_format)},
               {"scale_rule", scale_rule_name(t.scale_rule)},
               {"packing", "two codes per byte, even element in the low nibble, row-major"},
               {"reference_amax", float_repr(t.reference)},
               {"scale_target", float_repr(t.target)}};
  for (const auto& [k, v] : t.facts) meta["fact." + k] = v;
  tensors = {
      {"codes", "U8", {n_codes}, t.packed.data(), static_cast<uint64_t>(n_codes)},
      {"scales", "U8", {t.block_rows(), t.block_cols()}, t.scale_codes.data(),
       static_cast<uint64_t>(n_scales)},
      {"decode_scale", "F32", {1}, &t.decode_scale, 4}};  // little-endian host (safetensors.cpp)
  return safetensors::make_header(tensors, meta);
}

constexpr const char* kQTensorKind = "fp4train QTensor";
QTensor parse_qtensor(const safetensors::File& f);
}  // namespace

void save_safetensors(const QTensor& t, const fs::path& file) {
  std::vector<safetensors::TensorOut> tensors;
  const json header = qtensor_header(t, tensors);
  safetensors::write_file(file, header, tensors);
}

std::string qtensor_to_bytes(const QTensor& t) {
  std::vector<safetensors::TensorOut> tensors;
  const json header = qtensor_header(t, tensors);
  return safetensors::to_bytes(header, tensors);
}

QTensor load_safetensors(const fs::path& file) {
  return parse_qtensor(safetensors::File(file, kQTensorKind));
}

QTensor qtensor_from_bytes(std::string_view bytes, const std::string& name) {
  return parse_qtensor(safetensors::File::from_bytes(bytes, name, kQTensorKind));
}

namespace {
QTensor parse_qtensor(const safetensors::File& f) {
  auto bad = [&](const std::string& what) -> UserError { return f.error(what); };
  const json& h = f.header();

  QTensor t;
  try {
    const json& m = h.at("__metadata__");
    if (m.at("format") != "fp4train.qtensor.v1") throw bad("unknown format " + m.at("format").dump());
    // Whole-string integers in [0, 2^31) (block in [1, 2^16]) so sizes cannot overflow.
    auto integer = [&](const char* key, int64_t lo, int64_t hi) {
      const std::string v = m.at(key).get<std::string>();
      int64_t out = 0;
      const auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
      if (ec != std::errc() || p != v.data() + v.size() || v.empty() || out < lo || out > hi)
        throw bad(std::string("metadata '") + key + "' = '" + v + "' is not an integer in [" +
                  std::to_string(lo) + ", " + std::to_string(hi) + "]");
      return out;
    };
    t.rows = integer("rows", 0, (int64_t{1} << 31) - 1);
    t.cols = integer("cols", 0, (int64_t{1} << 31) - 1);
    t.block = static_cast<int>(integer("block", 1, 1 << 16));
    if (t.rows * t.cols > (int64_t{1} << 40)) throw bad("more than 2^40 elements");
    const std::string layout = m.at("layout");
    if (layout != "1d-row" && layout != "2d-tile") throw bad("unknown layout '" + layout + "'");
    t.two_d = layout == "2d-tile";
    t.element_format = m.at("element_format");
    if (t.element_format != "e2m1") throw bad("unsupported element format '" + t.element_format + "'");
    try {
      t.scale_format = parse_scale_format(m.at("scale_format"));
    } catch (const std::invalid_argument& e) {
      throw bad(e.what());
    }
    // Absent in files written before MX support: those are all tensor-scaled.
    if (m.contains("scale_rule")) {
      try {
        t.scale_rule = parse_scale_rule(m.at("scale_rule").get<std::string>());
      } catch (const std::invalid_argument& e) {
        throw bad(e.what());
      }
    }
    if (t.scale_rule != ScaleRule::TensorScaled && t.scale_format != ScaleFormat::UE8M0)
      throw bad(std::string("scale rule ") + scale_rule_name(t.scale_rule) +
                " needs ue8m0 scales (MXFP4), got " + scale_format_name(t.scale_format));
    // strtof, not stof: a subnormal reference (amax ~1e-40) must read back (stof throws).
    auto real = [&](const char* key) {
      const std::string v = m.at(key).get<std::string>();
      char* end = nullptr;
      const float f = std::strtof(v.c_str(), &end);
      if (v.empty() || end != v.c_str() + v.size() || !std::isfinite(f) || f < 0)
        throw bad(std::string("metadata '") + key + "' = '" + v + "' is not a finite number >= 0");
      return f;
    };
    t.reference = real("reference_amax");
    t.target = real("scale_target");
    if (!(t.target > 0)) throw bad("metadata 'scale_target' must be > 0");
    for (auto it = m.begin(); it != m.end(); ++it)
      if (it.key().rfind("fact.", 0) == 0) t.facts[it.key().substr(5)] = it.value();
    if (t.rows < 0 || t.cols < 0 || t.block <= 0) throw bad("negative shape or block <= 0");

    auto slice = [&](const char* key, uint64_t expect_bytes) {
      const auto bytes = f.tensor(key, std::string(key) == "decode_scale" ? "F32" : "U8");
      if (bytes.size() != expect_bytes)
        throw bad(std::string("tensor '") + key + "' has " + std::to_string(bytes.size()) +
                  " bytes, the layout needs " + std::to_string(expect_bytes));
      return std::vector<uint8_t>(bytes.begin(), bytes.end());
    };
    t.packed = slice("codes", static_cast<uint64_t>((t.rows * t.cols + 1) / 2));
    t.scale_codes = slice("scales", static_cast<uint64_t>(t.block_rows() * t.block_cols()));
    const auto ds = slice("decode_scale", 4);
    uint32_t u = 0;
    for (int i = 0; i < 4; ++i) u |= uint32_t(ds[i]) << (8 * i);
    std::memcpy(&t.decode_scale, &u, 4);
    if (t.scale_rule != ScaleRule::TensorScaled && t.decode_scale != 1.0f)
      throw bad(std::string("decode_scale must be 1 under scale rule ") +
                scale_rule_name(t.scale_rule) + " (MXFP4 has no tensor scale), got " +
                float_repr(t.decode_scale));
  } catch (const json::exception& e) {
    throw bad(std::string("missing or mistyped entry (") + e.what() + ")");
  } catch (const std::logic_error& e) {  // std::stoll / stof on a malformed number
    throw bad(std::string("malformed number in metadata (") + e.what() + ")");
  }
  for (uint8_t c : t.scale_codes) {
    try {
      (void)scale_decode(c, t.scale_format);
    } catch (const std::invalid_argument&) {
      throw bad("scale code " + std::to_string(c) + " is not a finite " +
                scale_format_name(t.scale_format) + " value");
    }
  }
  return t;
}

}  // namespace
}  // namespace fp4
