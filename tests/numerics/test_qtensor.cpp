// Packed FP4 tensors: packing layout, storage size, dequantize equality and safetensors
// round trip with clear errors on damaged files.
#include <gtest/gtest.h>
#include <unistd.h>

#include <bit>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "fp4/base/error.h"
#include "fp4/numerics/qtensor.h"

using namespace fp4;
namespace fs = std::filesystem;

namespace {
struct Scratch {
  fs::path dir = fs::temp_directory_path() / ("fp4test_qt_" + std::to_string(::getpid()));
  Scratch() { fs::create_directories(dir); }
  ~Scratch() { std::error_code ec; fs::remove_all(dir, ec); }
} g_scratch;

std::vector<float> randn(size_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d;
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

QuantizedTensor make(int64_t rows, int64_t cols, bool two_d, ScaleFormat sf = ScaleFormat::UE5M3) {
  auto x = randn(static_cast<size_t>(rows * cols), 7);
  BlockQuantSpec s;
  s.scale_format = sf;
  s.two_d = two_d;
  return quantize_blocks(x.data(), rows, cols, s, tensor_amax(x.data(), rows * cols), nullptr);
}

TEST(QTensor, PackingIsTwoCodesPerByteLowNibbleFirst) {
  QuantizedTensor q = make(1, 3, false);
  q.codes = {0x3, 0xA, 0x7};  // 1.5, −1, 6
  const QTensor t = pack(q);
  ASSERT_EQ(t.packed.size(), 2u);
  EXPECT_EQ(t.packed[0], 0xA3);  // element 0 low nibble, element 1 high nibble
  EXPECT_EQ(t.packed[1], 0x07);
  EXPECT_EQ(t.code(0), 0x3);
  EXPECT_EQ(t.code(1), 0xA);
  EXPECT_EQ(t.code(2), 0x7);
}

TEST(QTensor, StorageIsFourAndAHalfBitsPerElementAtBlock16) {
  const QTensor t = pack(make(64, 64, false));
  // 4096 elements: 2048 bytes of codes + 256 scale bytes = 4.5 bits/element, + one FP32.
  EXPECT_EQ(t.packed.size(), 2048u);
  EXPECT_EQ(t.scale_codes.size(), 256u);
  EXPECT_DOUBLE_EQ(t.bits_per_element(), 4.5);
  EXPECT_EQ(t.storage_bytes(), 2048 + 256 + 4);
}

TEST(QTensor, DequantizeEqualsUnpackedDequantizeBitForBit) {
  for (bool two_d : {false, true})
    for (ScaleFormat sf : {ScaleFormat::UE5M3, ScaleFormat::E4M3, ScaleFormat::UE5M3_PTX}) {
      const QuantizedTensor q = make(37, 45, two_d, sf);
      std::vector<float> a(37 * 45), b(37 * 45);
      dequantize(q, a.data());
      dequantize(pack(q), b.data());
      ASSERT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * 4)) << two_d;
    }
}

// unpack is pack's inverse on every field a QTensor stores: odd and even element counts (one
// large enough for unpack's threaded, vectorised nibble loop and its ragged last run), 1-D
// blocks and 2-D tiles, the four scale formats, the MX rule, a zero reference (ge = 1) and a zero
// block (the guarded scale); block_amax is not stored, so unpack leaves it empty.
TEST(QTensor, UnpackInvertsPackOnEveryStoredField) {
  struct Case {
    int64_t rows, cols;
    bool two_d;
    ScaleFormat sf;
    ScaleRule rule;
    bool zeros;
  };
  const Case cases[] = {{37, 45, false, ScaleFormat::UE5M3, ScaleRule::TensorScaled, false},
                        {37, 45, true, ScaleFormat::E4M3, ScaleRule::TensorScaled, false},
                        {16, 64, false, ScaleFormat::UE5M3_PTX, ScaleRule::TensorScaled, false},
                        {5, 33, false, ScaleFormat::UE8M0, ScaleRule::MxTe, false},
                        {3, 17, false, ScaleFormat::UE5M3, ScaleRule::TensorScaled, true},
                        // odd count above unpack's threshold for threads, several work items
                        {513, 1023, false, ScaleFormat::UE5M3, ScaleRule::TensorScaled, false}};
  for (const Case& c : cases) {
    auto x = randn(static_cast<size_t>(c.rows * c.cols), 11);
    if (c.zeros) std::fill(x.begin(), x.end(), 0.0f);
    x[0] = c.zeros ? 0.0f : 40.0f;  // an outlier in the first block
    BlockQuantSpec s;
    s.scale_format = c.sf;
    s.scale_rule = c.rule;
    s.two_d = c.two_d;
    s.target = 300.0f;
    const QuantizedTensor q =
        quantize_blocks(x.data(), c.rows, c.cols, s, tensor_amax(x.data(), c.rows * c.cols), nullptr);
    QuantizedTensor u;
    u.block_amax = {1.0f};  // stale content must not survive
    unpack(pack(q), u);
    const std::string what = std::to_string(c.rows) + "x" + std::to_string(c.cols) + " " +
                             scale_format_name(c.sf);
    EXPECT_EQ(u.rows, q.rows) << what;
    EXPECT_EQ(u.cols, q.cols) << what;
    EXPECT_EQ(u.block_rows, q.block_rows) << what;
    EXPECT_EQ(u.block_cols, q.block_cols) << what;
    EXPECT_EQ(u.spec.block, q.spec.block) << what;
    EXPECT_EQ(u.spec.two_d, q.spec.two_d) << what;
    EXPECT_EQ(u.spec.scale_format, q.spec.scale_format) << what;
    EXPECT_EQ(u.spec.scale_rule, q.spec.scale_rule) << what;
    EXPECT_EQ(u.spec.target, q.spec.target) << what;
    EXPECT_TRUE(u.spec.element.is_e2m1()) << what;
    EXPECT_EQ(std::bit_cast<uint32_t>(u.g), std::bit_cast<uint32_t>(q.g)) << what;
    EXPECT_EQ(std::bit_cast<uint32_t>(u.ge), std::bit_cast<uint32_t>(q.ge)) << what;
    EXPECT_EQ(std::bit_cast<uint32_t>(u.gd), std::bit_cast<uint32_t>(q.gd)) << what;
    EXPECT_EQ(u.codes, q.codes) << what;
    EXPECT_EQ(u.scale_codes, q.scale_codes) << what;
    ASSERT_EQ(u.scales.size(), q.scales.size()) << what;
    EXPECT_EQ(0, std::memcmp(u.scales.data(), q.scales.data(), q.scales.size() * 4)) << what;
    EXPECT_TRUE(u.block_amax.empty()) << what;
  }
}

TEST(QTensor, UnpackRejectsInconsistentTensorsNamingWhat) {
  const QTensor good = pack(make(4, 32, false));
  QuantizedTensor u;
  auto expect_throw = [&](QTensor t, const std::string& needle) {
    try {
      unpack(t, u);
      ADD_FAILURE() << "no throw, expected " << needle;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  QTensor t = good;
  t.packed.pop_back();
  expect_throw(t, "63 packed bytes");
  t = good;
  t.scale_codes.push_back(0);
  expect_throw(t, "9 scale codes");
  t = good;
  t.element_format = "int4";
  expect_throw(t, "'int4' is not e2m1");
  t = good;
  t.block = 0;
  expect_throw(t, "block 0");
  t = good;
  t.scale_format = ScaleFormat::E4M3;
  std::fill(t.scale_codes.begin(), t.scale_codes.end(), uint8_t{0x38});  // 1.0 in E4M3
  t.scale_codes[3] = 0x7F;  // E4M3's NaN code is not a scale
  expect_throw(t, "block 3");
}

TEST(QTensor, SafetensorsRoundTripAndReadableHeader) {
  const QTensor t = pack(make(19, 33, true), {{"recipe", "ue5m3-b16"}, {"role", "W"}});
  const fs::path p = g_scratch.dir / "w.safetensors";
  save_safetensors(t, p);
  const QTensor u = load_safetensors(p);
  EXPECT_EQ(u.rows, 19);
  EXPECT_EQ(u.cols, 33);
  EXPECT_TRUE(u.two_d);
  EXPECT_EQ(u.packed, t.packed);
  EXPECT_EQ(u.scale_codes, t.scale_codes);
  EXPECT_EQ(std::memcmp(&u.decode_scale, &t.decode_scale, 4), 0);
  EXPECT_EQ(u.reference, t.reference);
  EXPECT_EQ(u.facts.at("recipe"), "ue5m3-b16");
  // The file follows the safetensors layout: u64 LE header length, JSON header, data.
  std::ifstream f(p, std::ios::binary);
  unsigned char len[8];
  f.read(reinterpret_cast<char*>(len), 8);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t(len[i]) << (8 * i);
  std::string header(n, '\0');
  f.read(header.data(), static_cast<std::streamsize>(n));
  const auto h = nlohmann::json::parse(header);
  EXPECT_EQ(h["codes"]["dtype"], "U8");
  EXPECT_EQ(h["scales"]["shape"], nlohmann::json({2, 3}));  // ceil(19/16) × ceil(33/16)
  EXPECT_EQ(h["decode_scale"]["dtype"], "F32");
  EXPECT_EQ(h["__metadata__"]["scale_format"], "ue5m3");
  EXPECT_EQ(fs::file_size(p), 8 + n + t.packed.size() + t.scale_codes.size() + 4);
}

std::string load_error(const fs::path& p) {
  try {
    load_safetensors(p);
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

TEST(QTensor, DamagedFilesAreRejectedWithTheReason) {
  const fs::path p = g_scratch.dir / "x.safetensors";
  save_safetensors(pack(make(8, 40, false)), p);
  const auto full = fs::file_size(p);
  fs::resize_file(p, full - 3);
  EXPECT_NE(load_error(p).find("truncated"), std::string::npos) << load_error(p);
  std::ofstream(p, std::ios::binary | std::ios::trunc) << "abc";
  EXPECT_NE(load_error(p).find("shorter than 8 bytes"), std::string::npos);
  {
    std::ofstream o(p, std::ios::binary | std::ios::trunc);
    const char len[8] = {4, 0, 0, 0, 0, 0, 0, 0};
    o.write(len, 8);
    o << "{no}";
  }
  EXPECT_NE(load_error(p).find("not JSON"), std::string::npos) << load_error(p);
  EXPECT_NE(load_error(g_scratch.dir / "missing").find("cannot open"), std::string::npos);
}
}  // namespace

namespace {
TEST(QTensor, SubnormalReferenceRoundTrips) {
  std::vector<float> x(32, 1e-40f);  // amax is an FP32 subnormal
  BlockQuantSpec s;
  const QTensor t = pack(quantize_blocks(x.data(), 2, 16, s, tensor_amax(x.data(), 32), nullptr));
  const fs::path p = g_scratch.dir / "sub.safetensors";
  save_safetensors(t, p);
  EXPECT_EQ(load_safetensors(p).reference, t.reference);
}

TEST(QTensor, ShapesThatWouldOverflowAreRejected) {
  // Hand-written header: rows·cols far beyond the (empty) data; must not load.
  const std::string header =
      R"({"codes":{"dtype":"U8","shape":[0],"data_offsets":[0,0]},)"
      R"("scales":{"dtype":"U8","shape":[1,1],"data_offsets":[0,1]},)"
      R"("decode_scale":{"dtype":"F32","shape":[1],"data_offsets":[1,5]},)"
      R"("__metadata__":{"format":"fp4train.qtensor.v1","rows":"8589934592","cols":"2147483648",)"
      R"("block":"1073741824","layout":"2d-tile","element_format":"e2m1","scale_format":"ue5m3",)"
      R"("reference_amax":"1","scale_target":"448"}})";
  const fs::path p = g_scratch.dir / "wrap.safetensors";
  {
    std::ofstream o(p, std::ios::binary);
    const uint64_t n = header.size();
    for (int i = 0; i < 8; ++i) o.put(static_cast<char>(n >> (8 * i)));
    o << header << std::string(5, '\0');
  }
  EXPECT_NE(load_error(p).find("rows"), std::string::npos) << load_error(p);
}
}  // namespace

namespace {
// MXFP4 QTensors (docs/formats.md "`mx-te` and `mx-ocp` (MXFP4)"): E2M1 codes with UE8M0
// power-of-two scales and no tensor scale (decode_scale exactly 1) under both MX rules. Save,
// load: codes, scale codes, the rule and the dequantized values are those of the
// QuantizedTensor, bit for bit.
TEST(QTensor, MxRulesSaveAndLoadBack) {
  for (ScaleRule rule : {ScaleRule::MxTe, ScaleRule::MxOcp}) {
    for (bool two_d : {false, true}) {
      SCOPED_TRACE(std::string(scale_rule_name(rule)) + (two_d ? " 2-D" : " 1-D"));
      auto x = randn(static_cast<size_t>(37 * 70), 11);
      x[5] = 1000.f;  // hand-computed block (docs/formats.md): te scale 256, ocp scale 128
      BlockQuantSpec s;
      s.scale_format = ScaleFormat::UE8M0;
      s.scale_rule = rule;
      s.block = 32;
      s.two_d = two_d;
      const QuantizedTensor q = quantize_blocks(x.data(), 37, 70, s, 0.f, nullptr);
      const QTensor t = pack(q, {{"recipe", "mxfp4"}});
      EXPECT_EQ(t.scale_rule, rule);
      EXPECT_EQ(t.decode_scale, 1.0f);
      if (!two_d) {
        EXPECT_EQ(t.scale_codes[0], rule == ScaleRule::MxTe ? 127 + 8 : 127 + 7);
      }
      const fs::path p = g_scratch.dir / "mx.safetensors";
      save_safetensors(t, p);
      const QTensor u = load_safetensors(p);
      EXPECT_EQ(u.scale_rule, rule);
      EXPECT_EQ(u.scale_format, ScaleFormat::UE8M0);
      EXPECT_EQ(u.two_d, two_d);
      EXPECT_EQ(u.packed, t.packed);
      EXPECT_EQ(u.scale_codes, t.scale_codes);
      EXPECT_EQ(u.scale_codes, q.scale_codes);
      EXPECT_EQ(u.decode_scale, 1.0f);
      EXPECT_EQ(u.facts.at("recipe"), "mxfp4");
      for (int64_t i = 0; i < 37 * 70; ++i) ASSERT_EQ(u.code(i), q.codes[static_cast<size_t>(i)]) << i;
      std::vector<float> want(x.size()), got(x.size());
      dequantize(q, want.data());
      dequantize(u, got.data());
      EXPECT_EQ(std::memcmp(want.data(), got.data(), want.size() * 4), 0);
    }
  }
}

// A tensor-scaled file names its rule too; a file without the key (written before MX
// support) reads as tensor-scaled; an MX file needs UE8M0 scales and decode_scale 1.
TEST(QTensor, ScaleRuleMetadata) {
  const QTensor t = pack(make(4, 32, false));
  EXPECT_EQ(t.scale_rule, ScaleRule::TensorScaled);
  const fs::path p = g_scratch.dir / "rule.safetensors";
  save_safetensors(t, p);
  EXPECT_EQ(load_safetensors(p).scale_rule, ScaleRule::TensorScaled);
  QTensor bad = t;
  bad.scale_rule = ScaleRule::MxTe;  // ue5m3 scales under an MX rule: not MXFP4
  save_safetensors(bad, p);
  EXPECT_NE(load_error(p).find("ue8m0"), std::string::npos) << load_error(p);
  // An MX QuantizedTensor with a tensor scale is not MXFP4: pack names the rule.
  BlockQuantSpec s;
  s.scale_format = ScaleFormat::UE8M0;
  s.scale_rule = ScaleRule::MxOcp;
  QuantizedTensor q = quantize_blocks(std::vector<float>(32, 1.f).data(), 1, 32, s, 0.f, nullptr);
  q.gd = 0.5f;  // an MX tensor has no tensor scale
  try {
    (void)pack(q);
    ADD_FAILURE() << "no throw";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("mx-ocp"), std::string::npos) << e.what();
  }
}
}  // namespace
