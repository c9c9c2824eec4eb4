// The GGUF writer and reader (fp4/base/gguf.h) against bytes laid out by hand from ggml's
// gguf.h description, round trips of every value type, and malformed files.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "fp4/base/error.h"
#include "fp4/base/gguf.h"

namespace {
using fp4::gguf::TensorType;
using fp4::gguf::ValueType;

// Little-endian bytes of an unsigned value.
void le(std::vector<uint8_t>& o, uint64_t v, int n) {
  for (int i = 0; i < n; ++i) o.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
void str(std::vector<uint8_t>& o, const std::string& s) {
  le(o, s.size(), 8);
  o.insert(o.end(), s.begin(), s.end());
}

// One u32 pair and one F32 tensor of 2 values, byte by byte: a 24-byte header, the pair (17
// bytes), the tensor info (33 bytes), padding to 96, 8 data bytes, padding to 128.
std::vector<uint8_t> hand_file() {
  std::vector<uint8_t> o = {'G', 'G', 'U', 'F'};
  le(o, 3, 4);  // version
  le(o, 1, 8);  // tensors
  le(o, 1, 8);  // metadata pairs
  str(o, "a");
  le(o, 4, 4);  // U32
  le(o, 7, 4);
  str(o, "t");
  le(o, 1, 4);  // n_dims
  le(o, 2, 8);  // ne[0]
  le(o, 0, 4);  // F32
  le(o, 0, 8);  // offset
  o.resize(96, 0);
  le(o, 0x3F800000u, 4);  // 1.0f
  le(o, 0xC0000000u, 4);  // -2.0f
  o.resize(128, 0);
  return o;
}

TEST(Gguf, WriterMatchesHandLayout) {
  fp4::gguf::Writer w;
  w.add("a", ValueType::U32, 7);
  const float v[2] = {1.0f, -2.0f};
  w.add_f32("t", {2}, v);
  EXPECT_EQ(w.bytes(), hand_file());
}

TEST(Gguf, ReaderReadsHandLayout) {
  const fp4::gguf::File f = fp4::gguf::parse(hand_file(), "hand");
  EXPECT_EQ(f.version, 3u);
  ASSERT_EQ(f.kv.size(), 1u);
  EXPECT_EQ(f.kv[0].key, "a");
  EXPECT_EQ(f.kv[0].type, ValueType::U32);
  EXPECT_EQ(f.kv[0].value.get<uint32_t>(), 7u);
  ASSERT_EQ(f.tensors.size(), 1u);
  EXPECT_EQ(f.tensors[0].ne, std::vector<int64_t>{2});
  EXPECT_EQ(f.data_start, 96u);
  float got[2];
  std::memcpy(got, f.data.data() + f.tensors[0].offset, 8);
  EXPECT_EQ(got[0], 1.0f);
  EXPECT_EQ(got[1], -2.0f);
}

TEST(Gguf, EveryValueTypeRoundTrips) {
  fp4::gguf::Writer w;
  w.add("u8", ValueType::U8, 255);
  w.add("i8", ValueType::I8, -128);
  w.add("u16", ValueType::U16, 65535);
  w.add("i16", ValueType::I16, -32768);
  w.add("u32", ValueType::U32, 4294967295u);
  w.add("i32", ValueType::I32, -2147483647 - 1);
  w.add("u64", ValueType::U64, 18446744073709551615ull);
  w.add("i64", ValueType::I64, -9223372036854775807ll - 1);
  w.add("f32", ValueType::F32, 0.1f);
  w.add("f64", ValueType::F64, 0.1);
  w.add("b", ValueType::Bool, true);
  w.add("s", ValueType::String, "héllo");
  w.add_array("as", ValueType::String, {"<unk>", "", "▁the"});
  w.add_array("af", ValueType::F32, {0.0, -1.5, 3.25});
  w.add_array("ai", ValueType::I32, {1, 2, 3, 6});
  w.add("general.alignment", ValueType::U32, 64);
  std::vector<uint8_t> q(36 * 2, 0xAB);
  w.add_tensor("nv", {64, 2}, TensorType::NVFP4, q);
  std::vector<uint8_t> mx(17, 0x11);
  w.add_tensor("mx", {32}, TensorType::MXFP4, mx);
  const fp4::gguf::File f = fp4::gguf::parse(w.bytes(), "round trip");
  EXPECT_EQ(f.alignment, 64u);
  EXPECT_EQ(f.find("u8")->value.get<int>(), 255);
  EXPECT_EQ(f.find("i8")->value.get<int>(), -128);
  EXPECT_EQ(f.find("u16")->value.get<int>(), 65535);
  EXPECT_EQ(f.find("i16")->value.get<int>(), -32768);
  EXPECT_EQ(f.find("u32")->value.get<uint32_t>(), 4294967295u);
  EXPECT_EQ(f.find("i32")->value.get<int32_t>(), -2147483647 - 1);
  EXPECT_EQ(f.find("u64")->value.get<uint64_t>(), 18446744073709551615ull);
  EXPECT_EQ(f.find("i64")->value.get<int64_t>(), -9223372036854775807ll - 1);
  EXPECT_EQ(f.find("f32")->value.get<float>(), 0.1f);
  EXPECT_EQ(f.find("f64")->value.get<double>(), 0.1);
  EXPECT_EQ(f.find("b")->value.get<bool>(), true);
  EXPECT_EQ(f.find("s")->value.get<std::string>(), "héllo");
  EXPECT_EQ(f.find("as")->elem, ValueType::String);
  EXPECT_EQ(f.find("as")->value, nlohmann::json({"<unk>", "", "▁the"}));
  EXPECT_EQ(f.find("af")->value, nlohmann::json({0.0, -1.5, 3.25}));
  EXPECT_EQ(f.find("ai")->value, nlohmann::json({1, 2, 3, 6}));
  const fp4::gguf::TensorInfo* nv = f.tensor("nv");
  ASSERT_NE(nv, nullptr);
  EXPECT_EQ(nv->bytes, 72u);
  EXPECT_EQ(nv->offset % 64, 0u);
  EXPECT_EQ(f.data[nv->offset], 0xAB);
  EXPECT_EQ(f.tensor("mx")->offset, 128u);  // 72 bytes rounded up to 64
  EXPECT_EQ(f.data[f.tensor("mx")->offset], 0x11);
}

TEST(Gguf, TensorBytesFollowBlocks) {
  EXPECT_EQ(fp4::gguf::tensor_bytes(TensorType::F32, {3, 5}), 60u);
  EXPECT_EQ(fp4::gguf::tensor_bytes(TensorType::MXFP4, {64, 3}), 2u * 3 * 17);
  EXPECT_EQ(fp4::gguf::tensor_bytes(TensorType::NVFP4, {128, 2}), 2u * 2 * 36);
  EXPECT_THROW(fp4::gguf::tensor_bytes(TensorType::NVFP4, {48, 2}), std::invalid_argument);
  EXPECT_THROW(fp4::gguf::tensor_bytes(TensorType::F32, {-1}), std::invalid_argument);
}

TEST(Gguf, WriterRefusesWhatDoesNotFit) {
  fp4::gguf::Writer w;
  EXPECT_THROW(w.add("x", ValueType::U32, -1), std::invalid_argument);
  EXPECT_THROW(w.add("x", ValueType::U8, 256), std::invalid_argument);
  EXPECT_THROW(w.add("x", ValueType::String, 3), std::invalid_argument);
  w.add("x", ValueType::U32, 1);
  EXPECT_THROW(w.add("x", ValueType::U32, 2), std::invalid_argument);
  EXPECT_THROW(w.add_tensor("t", {64}, TensorType::NVFP4, std::vector<uint8_t>(35)),
               std::invalid_argument);
}

// Each malformed file is refused with a message naming the source and what is wrong.
void expect_refused(std::vector<uint8_t> b, const std::string& fragment) {
  try {
    fp4::gguf::parse(b, "bad.gguf");
    ADD_FAILURE() << "accepted; wanted '" << fragment << "'";
  } catch (const fp4::UserError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("bad.gguf"), std::string::npos) << m;
    EXPECT_NE(m.find(fragment), std::string::npos) << m;
  }
}

TEST(Gguf, MalformedFilesAreRefused) {
  const std::vector<uint8_t> good = hand_file();
  auto b = good;
  b[0] = 'X';
  expect_refused(b, "magic");
  b = good;
  b[4] = 9;
  expect_refused(b, "version 9");
  expect_refused(std::vector<uint8_t>(good.begin(), good.begin() + 30), "past the end");
  b = good;
  b[16] = 0xFF;  // metadata count low byte: 255 pairs in 128 bytes
  b[23] = 0x7F;
  expect_refused(b, "count larger than the file");
  b = good;
  b[24 + 9] = 99;  // value type of "a"
  expect_refused(b, "unknown value type 99");
  b = good;
  b[41 + 9 + 4 + 8] = 77;  // tensor type
  expect_refused(b, "type 77");
  b = good;
  b[41 + 9 + 4] = 200;  // ne[0] = 200 floats: past the end
  expect_refused(b, "run past the end");
  b = good;
  b[41 + 9 + 4 + 8 + 4] = 4;  // offset 4: not aligned
  expect_refused(b, "not aligned");
}

}  // namespace
