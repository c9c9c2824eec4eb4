// GGUF, the model file of llama.cpp (ggml's gguf.h, version 3), written and read by fp4train.
// Layout, all little-endian:
//   "GGUF" | u32 version = 3 | u64 tensor count | u64 metadata count
//   metadata: string key | u32 value type | value   (a string is u64 length + bytes; an array
//             is u32 element type + u64 count + elements)
//   tensor infos: string name | u32 n_dims | u64 ne[n_dims] (ne[0] varies fastest) |
//                 u32 ggml type | u64 offset (from the data section, a multiple of alignment)
//   padding to `general.alignment` (default 32), then the data section.
// docs/export.md "GGUF for llama.cpp" says which keys and tensors fp4train writes.
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace fp4::gguf {

/// Metadata value types (gguf.h `enum gguf_type`).
enum class ValueType : uint32_t {
  U8 = 0,
  I8 = 1,
  U16 = 2,
  I16 = 3,
  U32 = 4,
  I32 = 5,
  F32 = 6,
  Bool = 7,
  String = 8,
  Array = 9,
  U64 = 10,
  I64 = 11,
  F64 = 12,
};

/// The tensor types fp4train writes (ggml.h `enum ggml_type`): F32; MXFP4 (blocks of 32 E2M1
/// values, one E8M0 scale byte then 16 bytes of codes); NVFP4 (blocks of 64 values: four UE4M3
/// scale bytes, one per 16 values, then 32 bytes of codes). Others are read as unknown.
enum class TensorType : uint32_t { F32 = 0, F16 = 1, Q8_0 = 8, BF16 = 30, MXFP4 = 39, NVFP4 = 40 };

/// Name of a tensor type ("F32", "MXFP4", ...), or "type <n>" for one this file does not know.
std::string type_name(TensorType t);

/// Bytes of a tensor of `type` with dims `ne` (ne[0] fastest). Throws std::invalid_argument
/// for an unknown type, a negative dim, or ne[0] not a multiple of the type's block length.
uint64_t tensor_bytes(TensorType type, const std::vector<int64_t>& ne);

/// One metadata pair. `value` holds a number, bool or string, or for an Array the elements
/// as a JSON array of `elem` values (arrays of arrays are not supported).
struct KeyValue {
  std::string key;
  ValueType type = ValueType::U32;
  ValueType elem = ValueType::U8;  ///< element type of an Array
  nlohmann::json value;
};

/// One tensor's header entry; `offset` counts from the start of the data section.
struct TensorInfo {
  std::string name;
  std::vector<int64_t>
      ne;  ///< dims, ne[0] varies fastest (a row-major [rows, cols] matrix is {cols, rows})
  TensorType type = TensorType::F32;
  uint64_t offset = 0;
  uint64_t bytes = 0;  ///< tensor_bytes(type, ne)
};

/// A parsed GGUF file: its header and the raw data section.
struct File {
  uint32_t version = 3;
  uint64_t alignment = 32;
  std::vector<KeyValue> kv;
  std::vector<TensorInfo> tensors;
  uint64_t data_start = 0;    ///< byte offset of the data section in the file
  std::vector<uint8_t> data;  ///< the data section (tensor t at data[t.offset, t.offset + t.bytes))

  /// The pair with this key, or nullptr.
  const KeyValue* find(const std::string& key) const;
  /// The tensor with this name, or nullptr.
  const TensorInfo* tensor(const std::string& name) const;
};

/// Builds a GGUF file in memory and writes it atomically (fp4::AtomicFile). Keys and tensor
/// names must be unique (std::invalid_argument otherwise); general.alignment is 32 unless set.
class Writer {
 public:
  /// A scalar or string pair: `type` is any ValueType but Array; `value` a JSON number, bool
  /// or string of that type (std::invalid_argument if it does not fit, e.g. -1 as U32).
  void add(const std::string& key, ValueType type, const nlohmann::json& value);
  /// An array pair of `elem` values (a JSON array).
  void add_array(const std::string& key, ValueType elem, const nlohmann::json& values);
  /// A tensor: `bytes` must hold exactly tensor_bytes(type, ne) bytes.
  void add_tensor(const std::string& name, std::vector<int64_t> ne, TensorType type,
                  std::vector<uint8_t> bytes);
  /// An F32 tensor of ne[0]·ne[1]·… values.
  void add_f32(const std::string& name, std::vector<int64_t> ne, const float* values);
  /// The whole file as bytes.
  std::vector<uint8_t> bytes() const;
  /// Write the file to `path` (fp4::IoError / fp4::UserError naming it on failure).
  void write(const std::filesystem::path& path) const;

 private:
  std::vector<KeyValue> kv_;
  struct Tensor {
    TensorInfo info;
    std::vector<uint8_t> bytes;
  };
  std::vector<Tensor> tensors_;
};

/// Parse GGUF bytes; `where` names the source in errors. Throws fp4::UserError naming `where`
/// and the byte offset for a bad magic, a version other than 2 or 3, a length or count past the
/// end, an unknown value type, a tensor of unknown type or with more than 4 dims, a misaligned or
/// overlapping tensor, or data past the end of the file.
File parse(const std::vector<uint8_t>& bytes, const std::string& where);

/// Read and parse a GGUF file (fp4::UserError if it cannot be read, or as parse()).
File read(const std::filesystem::path& path);

}  // namespace fp4::gguf
