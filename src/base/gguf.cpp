// GGUF writer and reader (fp4/base/gguf.h).
#include "fp4/base/gguf.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <set>
#include <stdexcept>

#include "fp4/base/error.h"
#include "fp4/base/safetensors.h"  // AtomicFile

namespace fp4::gguf {
namespace {
using json = nlohmann::json;
static_assert(std::endian::native == std::endian::little, "GGUF is little-endian");

// Block length (values) and bytes per block of a tensor type; {0, 0} if unknown.
std::pair<int64_t, int64_t> block_of(TensorType t) {
  switch (t) {
    case TensorType::F32:
      return {1, 4};
    case TensorType::F16:
      return {1, 2};
    case TensorType::BF16:
      return {1, 2};
    case TensorType::Q8_0:
      return {32, 34};
    case TensorType::MXFP4:
      return {32, 17};
    case TensorType::NVFP4:
      return {64, 36};
  }
  return {0, 0};
}

// Bytes of one scalar of a value type (0 for String, Array and unknown types).
size_t scalar_size(ValueType t) {
  switch (t) {
    case ValueType::U8:
    case ValueType::I8:
    case ValueType::Bool:
      return 1;
    case ValueType::U16:
    case ValueType::I16:
      return 2;
    case ValueType::U32:
    case ValueType::I32:
    case ValueType::F32:
      return 4;
    case ValueType::U64:
    case ValueType::I64:
    case ValueType::F64:
      return 8;
    default:
      return 0;
  }
}

bool known_value_type(uint32_t t) { return t <= static_cast<uint32_t>(ValueType::F64); }

// ---- writing ----------------------------------------------------------------------------
void put_raw(std::vector<uint8_t>& o, const void* p, size_t n) {
  const auto* b = static_cast<const uint8_t*>(p);
  o.insert(o.end(), b, b + n);
}
template <class T>
void put(std::vector<uint8_t>& o, T v) {
  put_raw(o, &v, sizeof v);
}
void put_string(std::vector<uint8_t>& o, const std::string& s) {
  put<uint64_t>(o, s.size());
  put_raw(o, s.data(), s.size());
}

// The scalar `v` of type `t` appended; std::invalid_argument naming `key` if it does not fit.
void put_scalar(std::vector<uint8_t>& o, ValueType t, const json& v, const std::string& key) {
  auto bad = [&] {
    throw std::invalid_argument("gguf: value " + v.dump() + " of key '" + key +
                                "' does not fit its type " +
                                std::to_string(static_cast<uint32_t>(t)));
  };
  auto integer = [&](long double lo, long double hi) {
    if (!v.is_number_integer()) bad();
    const long double x = v.is_number_unsigned() ? static_cast<long double>(v.get<uint64_t>())
                                                 : static_cast<long double>(v.get<int64_t>());
    if (x < lo || x > hi) bad();
  };
  switch (t) {
    case ValueType::U8:
      integer(0, 255);
      put<uint8_t>(o, v.get<uint8_t>());
      break;
    case ValueType::I8:
      integer(-128, 127);
      put<int8_t>(o, v.get<int8_t>());
      break;
    case ValueType::U16:
      integer(0, 65535);
      put<uint16_t>(o, v.get<uint16_t>());
      break;
    case ValueType::I16:
      integer(-32768, 32767);
      put<int16_t>(o, v.get<int16_t>());
      break;
    case ValueType::U32:
      integer(0, 4294967295.0L);
      put<uint32_t>(o, v.get<uint32_t>());
      break;
    case ValueType::I32:
      integer(-2147483648.0L, 2147483647.0L);
      put<int32_t>(o, v.get<int32_t>());
      break;
    case ValueType::U64:
      integer(0, 18446744073709551615.0L);
      put<uint64_t>(o, v.get<uint64_t>());
      break;
    case ValueType::I64:
      integer(-9223372036854775808.0L, 9223372036854775807.0L);
      put<int64_t>(o, v.get<int64_t>());
      break;
    case ValueType::F32:
      if (!v.is_number()) bad();
      put<float>(o, v.get<float>());
      break;
    case ValueType::F64:
      if (!v.is_number()) bad();
      put<double>(o, v.get<double>());
      break;
    case ValueType::Bool:
      if (!v.is_boolean()) bad();
      put<uint8_t>(o, v.get<bool>() ? 1 : 0);
      break;
    case ValueType::String:
      if (!v.is_string()) bad();
      put_string(o, v.get<std::string>());
      break;
    default:
      bad();
  }
}

// ---- reading ----------------------------------------------------------------------------
// A cursor over the file's bytes whose every read is bounds-checked.
struct Cursor {
  const std::vector<uint8_t>& b;
  const std::string& where;
  uint64_t pos = 0;

  [[noreturn]] void fail(const std::string& what) const {
    throw UserError("gguf " + where + ": at byte " + std::to_string(pos) + ": " + what);
  }
  void need(uint64_t n, const char* what) const {
    if (n > b.size() || pos > b.size() - n)
      fail(std::string(what) + " runs past the end of the file (" + std::to_string(b.size()) +
           " bytes)");
  }
  template <class T>
  T get(const char* what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, b.data() + pos, sizeof v);
    pos += sizeof v;
    return v;
  }
  std::string string(const char* what) {
    const auto n = get<uint64_t>(what);
    need(n, what);
    std::string s(reinterpret_cast<const char*>(b.data() + pos), static_cast<size_t>(n));
    pos += n;
    return s;
  }
  json scalar(ValueType t, const char* what) {
    switch (t) {
      case ValueType::U8:
        return get<uint8_t>(what);
      case ValueType::I8:
        return get<int8_t>(what);
      case ValueType::U16:
        return get<uint16_t>(what);
      case ValueType::I16:
        return get<int16_t>(what);
      case ValueType::U32:
        return get<uint32_t>(what);
      case ValueType::I32:
        return get<int32_t>(what);
      case ValueType::U64:
        return get<uint64_t>(what);
      case ValueType::I64:
        return get<int64_t>(what);
      case ValueType::F32:
        return get<float>(what);
      case ValueType::F64:
        return get<double>(what);
      case ValueType::Bool: {
        const auto v = get<uint8_t>(what);
        if (v > 1) fail(std::string(what) + ": bool byte " + std::to_string(v) + " is not 0 or 1");
        return v == 1;
      }
      case ValueType::String:
        return string(what);
      default:
        fail(std::string(what) + ": unexpected value type");
    }
  }
};

// Metadata pair `i` at the cursor.
KeyValue read_kv(Cursor& c) {
  KeyValue kv;
  kv.key = c.string("metadata key");
  const auto t = c.get<uint32_t>("metadata value type");
  if (!known_value_type(t)) c.fail("key '" + kv.key + "': unknown value type " + std::to_string(t));
  kv.type = static_cast<ValueType>(t);
  if (kv.type != ValueType::Array) {
    kv.value = c.scalar(kv.type, "metadata value");
    return kv;
  }
  const auto e = c.get<uint32_t>("array element type");
  if (!known_value_type(e) || e == static_cast<uint32_t>(ValueType::Array))
    c.fail("key '" + kv.key + "': unsupported array element type " + std::to_string(e));
  kv.elem = static_cast<ValueType>(e);
  const auto n = c.get<uint64_t>("array length");
  // Each element takes at least one byte (a string at least 8): a count beyond the remaining
  // bytes is corrupt, and checking it first keeps a bad count from allocating.
  const uint64_t min_each = kv.elem == ValueType::String ? 8 : scalar_size(kv.elem);
  if (n > (c.b.size() - c.pos) / min_each)
    c.fail("key '" + kv.key + "': array length " + std::to_string(n) +
           " runs past the end of the file");
  kv.value = json::array();
  for (uint64_t i = 0; i < n; ++i) kv.value.push_back(c.scalar(kv.elem, "array element"));
  return kv;
}

TensorInfo read_tensor_info(Cursor& c) {
  TensorInfo t;
  t.name = c.string("tensor name");
  const auto nd = c.get<uint32_t>("tensor n_dims");
  if (nd == 0 || nd > 4)
    c.fail("tensor '" + t.name + "': " + std::to_string(nd) + " dims (1 to 4)");
  for (uint32_t d = 0; d < nd; ++d) {
    const auto ne = c.get<uint64_t>("tensor dim");
    if (ne > static_cast<uint64_t>(std::numeric_limits<int64_t>::max() / 64))
      c.fail("tensor '" + t.name + "': dim " + std::to_string(ne) + " is too large");
    t.ne.push_back(static_cast<int64_t>(ne));
  }
  t.type = static_cast<TensorType>(c.get<uint32_t>("tensor type"));
  if (block_of(t.type).first == 0)
    c.fail("tensor '" + t.name + "': " + type_name(t.type) + " is not a type fp4train reads");
  t.offset = c.get<uint64_t>("tensor offset");
  try {
    t.bytes = tensor_bytes(t.type, t.ne);
  } catch (const std::invalid_argument& e) {
    c.fail("tensor '" + t.name + "': " + e.what());
  }
  return t;
}
}  // namespace

std::string type_name(TensorType t) {
  switch (t) {
    case TensorType::F32:
      return "F32";
    case TensorType::F16:
      return "F16";
    case TensorType::BF16:
      return "BF16";
    case TensorType::Q8_0:
      return "Q8_0";
    case TensorType::MXFP4:
      return "MXFP4";
    case TensorType::NVFP4:
      return "NVFP4";
  }
  return "type " + std::to_string(static_cast<uint32_t>(t));
}

uint64_t tensor_bytes(TensorType type, const std::vector<int64_t>& ne) {
  const auto [block, block_bytes] = block_of(type);
  if (block == 0) throw std::invalid_argument("unknown tensor " + type_name(type));
  if (ne.empty()) throw std::invalid_argument("a tensor needs at least one dim");
  uint64_t n = 1;
  for (int64_t d : ne) {
    if (d < 0) throw std::invalid_argument("negative dim " + std::to_string(d));
    if (d != 0 && n > std::numeric_limits<uint64_t>::max() / 64 / static_cast<uint64_t>(d))
      throw std::invalid_argument("too many values");
    n *= static_cast<uint64_t>(d);
  }
  if (ne[0] % block != 0)
    throw std::invalid_argument(type_name(type) + " needs ne[0] (" + std::to_string(ne[0]) +
                                ") to be a multiple of its block of " + std::to_string(block));
  return n / static_cast<uint64_t>(block) * static_cast<uint64_t>(block_bytes);
}

const KeyValue* File::find(const std::string& key) const {
  for (const KeyValue& kv : this->kv)
    if (kv.key == key) return &kv;
  return nullptr;
}

const TensorInfo* File::tensor(const std::string& name) const {
  for (const TensorInfo& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

void Writer::add(const std::string& key, ValueType type, const json& value) {
  if (type == ValueType::Array)
    throw std::invalid_argument("gguf: use add_array for '" + key + "'");
  for (const KeyValue& kv : kv_)
    if (kv.key == key) throw std::invalid_argument("gguf: duplicate key '" + key + "'");
  std::vector<uint8_t> check;
  put_scalar(check, type, value, key);  // throws if it does not fit
  kv_.push_back({key, type, ValueType::U8, value});
}

void Writer::add_array(const std::string& key, ValueType elem, const json& values) {
  if (!values.is_array() || elem == ValueType::Array)
    throw std::invalid_argument("gguf: '" + key + "' needs a JSON array of scalars");
  for (const KeyValue& kv : kv_)
    if (kv.key == key) throw std::invalid_argument("gguf: duplicate key '" + key + "'");
  std::vector<uint8_t> check;
  for (const json& v : values) put_scalar(check, elem, v, key);
  kv_.push_back({key, ValueType::Array, elem, values});
}

void Writer::add_tensor(const std::string& name, std::vector<int64_t> ne, TensorType type,
                        std::vector<uint8_t> bytes) {
  for (const Tensor& t : tensors_)
    if (t.info.name == name) throw std::invalid_argument("gguf: duplicate tensor '" + name + "'");
  if (ne.empty() || ne.size() > 4)
    throw std::invalid_argument("gguf: tensor '" + name + "' needs 1 to 4 dims");
  const uint64_t want = tensor_bytes(type, ne);
  if (bytes.size() != want)
    throw std::invalid_argument("gguf: tensor '" + name + "' has " + std::to_string(bytes.size()) +
                                " bytes, its type and dims need " + std::to_string(want));
  tensors_.push_back({{name, std::move(ne), type, 0, want}, std::move(bytes)});
}

void Writer::add_f32(const std::string& name, std::vector<int64_t> ne, const float* values) {
  const uint64_t bytes = tensor_bytes(TensorType::F32, ne);
  std::vector<uint8_t> b(bytes);
  if (bytes) std::memcpy(b.data(), values, bytes);
  add_tensor(name, std::move(ne), TensorType::F32, std::move(b));
}

std::vector<uint8_t> Writer::bytes() const {
  uint64_t alignment = 32;
  for (const KeyValue& kv : kv_)
    if (kv.key == "general.alignment") alignment = kv.value.get<uint64_t>();
  if (alignment == 0 || (alignment & (alignment - 1)) != 0)
    throw std::invalid_argument("gguf: general.alignment must be a power of 2");
  auto align = [&](uint64_t x) { return (x + alignment - 1) / alignment * alignment; };
  std::vector<uint8_t> o;
  // header
  put_raw(o, "GGUF", 4);
  put<uint32_t>(o, 3);
  put<uint64_t>(o, tensors_.size());
  put<uint64_t>(o, kv_.size());
  // metadata
  for (const KeyValue& kv : kv_) {
    put_string(o, kv.key);
    put<uint32_t>(o, static_cast<uint32_t>(kv.type));
    if (kv.type != ValueType::Array) {
      put_scalar(o, kv.type, kv.value, kv.key);
      continue;
    }
    put<uint32_t>(o, static_cast<uint32_t>(kv.elem));
    put<uint64_t>(o, kv.value.size());
    for (const json& v : kv.value) put_scalar(o, kv.elem, v, kv.key);
  }
  // tensor infos, each tensor at the next aligned offset of the data section
  uint64_t offset = 0;
  for (const Tensor& t : tensors_) {
    put_string(o, t.info.name);
    put<uint32_t>(o, static_cast<uint32_t>(t.info.ne.size()));
    for (int64_t d : t.info.ne) put<uint64_t>(o, static_cast<uint64_t>(d));
    put<uint32_t>(o, static_cast<uint32_t>(t.info.type));
    put<uint64_t>(o, offset);
    offset = align(offset + t.info.bytes);
  }
  // data section
  o.resize(align(o.size()), 0);
  for (const Tensor& t : tensors_) {
    put_raw(o, t.bytes.data(), t.bytes.size());
    o.resize(o.size() + (align(t.bytes.size()) - t.bytes.size()), 0);
  }
  return o;
}

void Writer::write(const std::filesystem::path& path) const {
  const std::vector<uint8_t> b = bytes();
  AtomicFile f(path);
  f.write(b.data(), b.size());
  f.commit();
}

File parse(const std::vector<uint8_t>& bytes, const std::string& where) {
  Cursor c{bytes, where};
  File f;
  // header
  c.need(4, "magic");
  if (std::memcmp(bytes.data(), "GGUF", 4) != 0) c.fail("not a GGUF file (magic is not \"GGUF\")");
  c.pos = 4;
  f.version = c.get<uint32_t>("version");
  if (f.version != 2 && f.version != 3)
    c.fail("GGUF version " + std::to_string(f.version) + " (2 or 3 expected)");
  const auto n_tensors = c.get<uint64_t>("tensor count");
  const auto n_kv = c.get<uint64_t>("metadata count");
  // Every pair and every tensor info takes more than 8 bytes.
  if (n_tensors > bytes.size() / 8 || n_kv > bytes.size() / 8)
    c.fail("tensor or metadata count larger than the file");
  // metadata
  std::set<std::string> keys;
  for (uint64_t i = 0; i < n_kv; ++i) {
    KeyValue kv = read_kv(c);
    if (!keys.insert(kv.key).second) c.fail("duplicate key '" + kv.key + "'");
    if (kv.key == "general.alignment") {
      if (kv.type != ValueType::U32) c.fail("general.alignment is not a u32");
      f.alignment = kv.value.get<uint64_t>();
      if (f.alignment == 0 || (f.alignment & (f.alignment - 1)) != 0)
        c.fail("general.alignment is not a power of 2");
    }
    f.kv.push_back(std::move(kv));
  }
  // tensor infos
  std::set<std::string> names;
  for (uint64_t i = 0; i < n_tensors; ++i) {
    TensorInfo t = read_tensor_info(c);
    if (!names.insert(t.name).second) c.fail("duplicate tensor '" + t.name + "'");
    if (t.offset % f.alignment != 0)
      c.fail("tensor '" + t.name + "': offset " + std::to_string(t.offset) + " is not aligned to " +
             std::to_string(f.alignment));
    f.tensors.push_back(std::move(t));
  }
  // data section: every tensor inside it, none overlapping another
  f.data_start = (c.pos + f.alignment - 1) / f.alignment * f.alignment;
  if (f.data_start > bytes.size()) c.fail("the data section starts past the end of the file");
  const uint64_t data_size = bytes.size() - f.data_start;
  std::vector<std::pair<uint64_t, uint64_t>> spans;
  for (const TensorInfo& t : f.tensors) {
    if (t.offset > data_size || t.bytes > data_size - t.offset)
      c.fail("tensor '" + t.name + "': its " + std::to_string(t.bytes) + " bytes at offset " +
             std::to_string(t.offset) + " run past the end of the file");
    spans.emplace_back(t.offset, t.offset + t.bytes);
  }
  std::sort(spans.begin(), spans.end());
  for (size_t i = 1; i < spans.size(); ++i)
    if (spans[i].first < spans[i - 1].second) c.fail("two tensors overlap in the data section");
  f.data.assign(bytes.begin() + static_cast<std::ptrdiff_t>(f.data_start), bytes.end());
  return f;
}

File read(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UserError("gguf " + path.string() + ": cannot open");
  std::vector<uint8_t> b((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw UserError("gguf " + path.string() + ": read error");
  return parse(b, path.string());
}

}  // namespace fp4::gguf
