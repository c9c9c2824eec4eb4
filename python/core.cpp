// fp4train._core: the pybind11 extension behind the `fp4train` Python package (python/fp4train/,
// docs/python.md). Every numeric result comes from the C++ library the CLI uses (fp4core):
// format_encode / format_decode / element_encode / element_decode (fp4/numerics/format.h),
// quantize_blocks, dequantize and check_dequantized_finite (fp4/numerics/block_quant.h, as
// `fp4train quant`), pack / save_safetensors / load_safetensors (fp4/numerics/qtensor.h, `quant --save`),
// decoded_gemm / probe_gemm (fp4/gemm/probe_gemm.h, `fp4train gemm`), recipes, run configs and
// checkpoints (fp4/recipe/recipe.h, fp4/config/config.h, fp4/train/checkpoint.h). Nothing numeric is computed here.
//
// Arrays: numpy float32 (codes: uint8), C-contiguous; anything else is refused with TypeError
// (not an ndarray, wrong dtype) or ValueError (not C-contiguous, wrong number of dimensions).
// Errors: std::invalid_argument (and fp4::NonFiniteError) become ValueError, fp4::UserError
// becomes fp4train.UserError (a ValueError), other std::exception RuntimeError, each with the
// C++ message (elementwise functions prefix it with the flat index of the element).
// Long C++ calls run without the GIL.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <pybind11/stl/filesystem.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "fp4/numerics/block_quant.h"
#include "fp4/train/checkpoint.h"
#include "fp4/nn/run_config.h"
#include "fp4/base/error.h"
#include "fp4/numerics/format.h"
#include "fp4/train/info.h"
#include "fp4/train/resolved_run.h"
#include "fp4/nn/linear.h"
#include "fp4/nn/model.h"
#include "fp4/numerics/philox.h"
#include "fp4/gemm/probe_gemm.h"
#include "fp4/numerics/bf16.h"
#include "fp4/numerics/qtensor.h"
#include "fp4/recipe/recipe.h"
#include "fp4/config/settings.h"
#include "fp4/base/signal_mask.h"
#include "fp4/study/run_metrics.h"

namespace py = pybind11;

// Around every long C++ call: the GIL released (other Python threads run) and the asynchronous
// signals blocked on this thread and the OpenMP workers (fp4/base/signal_mask.h: a handler, e.g.
// Python's for SIGINT, running on a thread inside oneDNN's JIT GEMM corrupts the heap). A
// Ctrl-C meanwhile stays pending and is delivered when the call returns: KeyboardInterrupt
// then, not in the middle of a kernel. Destroyed in reverse order: signals unblocked (Python's
// C-level handler only records them), then the GIL taken back.
struct NoGil {
  py::gil_scoped_release release;
  fp4::ComputeSignalMask mask;
};
using namespace pybind11::literals;

namespace {

// ---- argument checks ---------------------------------------------------------------------

std::string type_name(const py::handle& h) { return py::str(py::type::of(h).attr("__name__")); }

/// `h` as a float32 (or uint8 with want_u8) C-contiguous ndarray; ndim < 0: any.
py::array checked_array(const py::handle& h, const char* name, bool want_u8, int ndim) {
  const char* dt = want_u8 ? "uint8" : "float32";
  if (!py::isinstance<py::array>(h)) {
    throw py::type_error(std::string(name) + " must be a numpy.ndarray of dtype " + dt + ", got " +
                         type_name(h) + " (use numpy.asarray(" + name + ", dtype=numpy." + dt +
                         "))");
  }
  py::array a = py::reinterpret_borrow<py::array>(h);
  // By type number (the dtype object need not be numpy's cached one), in native byte order.
  const py::dtype want = want_u8 ? py::dtype::of<uint8_t>() : py::dtype::of<float>();
  const bool ok = a.dtype().num() == want.num() && a.dtype().byteorder() != '>';
  if (!ok) {
    throw py::type_error(std::string(name) + " must have dtype " + dt + ", got " +
                         std::string(py::str(a.dtype())) + " (convert it explicitly with " +
                         name + ".astype(numpy." + dt + "); fp4train does not round silently)");
  }
  if (!(a.flags() & py::array::c_style)) {
    throw py::value_error(std::string(name) + " must be C-contiguous (row-major); got a strided "
                          "view: pass numpy.ascontiguousarray(" + name + ")");
  }
  if (ndim >= 0 && a.ndim() != ndim) {
    throw py::value_error(std::string(name) + " must have " + std::to_string(ndim) +
                          " dimensions, got shape " + std::string(py::str(py::tuple(
                                                          py::cast(std::vector<py::ssize_t>(
                                                              a.shape(), a.shape() + a.ndim()))))));
  }
  return a;
}

fp4::Rounding parse_rounding(const std::string& s, const char* what) {
  try {
    return fp4::parse_rounding_name(s);
  } catch (const std::invalid_argument&) {
    throw std::invalid_argument(std::string(what) + ": unknown value '" + s +
                                "' (valid choices: rne, sr8, rna)");
  }
}

template <class F>
auto prefixed(const std::string& prefix, F&& f) {
  try {
    return f();
  } catch (const fp4::UserError& e) {
    throw fp4::UserError(prefix + e.what());
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(prefix + e.what());
  }
}

py::array_t<float> new_f32(const std::vector<py::ssize_t>& shape) { return py::array_t<float>(shape); }
py::array_t<uint8_t> new_u8(const std::vector<py::ssize_t>& shape) { return py::array_t<uint8_t>(shape); }

std::vector<py::ssize_t> shape_of(const py::array& a) {
  return std::vector<py::ssize_t>(a.shape(), a.shape() + a.ndim());
}

/// ValueError "<name>: element [i, j] is NaN (<why>)" for the first non-finite element of a
/// checked float32 array (its index in the array's own shape), so the message names the
/// argument and the position the caller knows, not a flat index inside a kernel. Called only
/// once a C++ call has thrown fp4::NonFiniteError (catch it, call this for each input, then
/// rethrow): the kernels find non-finite values themselves, so the good path pays no second
/// pass over the data. Needs the GIL.
void require_finite(const py::array& a, const char* name, const char* why) {
  const float* p = static_cast<const float*>(a.data());
  const py::ssize_t n = a.size();
  for (py::ssize_t i = 0; i < n; ++i) {
    if (std::isfinite(p[i])) continue;
    std::string idx;
    py::ssize_t rest = i;
    for (py::ssize_t d = a.ndim() - 1; d >= 0; --d) {
      idx = std::to_string(rest % a.shape(d)) + (idx.empty() ? "" : ", ") + idx;
      rest /= a.shape(d);
    }
    throw py::value_error(std::string(name) + ": element [" + idx + "] is " +
                          (std::isnan(p[i]) ? "NaN" : p[i] > 0 ? "+Inf" : "-Inf") + " (" + why + ")");
  }
}

// ---- formats -----------------------------------------------------------------------------

bool is_int_grid(const std::string& name) {
  return name.size() >= 3 && (name[0] == 'i' || name[0] == 'I') && (name[1] == 'n' || name[1] == 'N') &&
         (name[2] == 't' || name[2] == 'T');
}

py::dict format_info(const std::string& name) {
  py::dict d;
  if (is_int_grid(name)) {
    const fp4::ElementFormat ef = fp4::parse_element_format(name);
    d["name"] = ef.name();
    d["kind"] = "int";
    d["bits"] = ef.bits();
    d["signed"] = true;
    d["min"] = ef.int_min;
    d["max"] = ef.int_max;
    d["max_finite"] = ef.max();
    return d;
  }
  const fp4::FloatFormat& f = fp4::parse_float_format(name);
  d["name"] = f.name;
  d["kind"] = "float";
  d["bits"] = f.bits();
  d["signed"] = f.has_sign;
  d["exp_bits"] = f.exp_bits;
  d["frac_bits"] = f.frac_bits;
  d["bias"] = f.bias;
  d["max_finite"] = f.max_finite;
  d["max_code"] = f.max_code();
  d["min_normal"] = fp4::format_min_normal(f);
  d["min_subnormal"] = fp4::format_min_subnormal(f);
  d["subnormals"] = f.subnormals;
  d["reserved_top"] = f.reserved_top;
  return d;
}

std::vector<std::string> named_formats() {
  std::vector<std::string> out;
  for (const fp4::FloatFormat* f : fp4::named_float_formats()) out.push_back(f->name);
  return out;
}

// The optional random bytes r of encode/round_to (one uint8 per element of x, the shape of x;
// required for SR8): a pointer into `keep`, which holds the checked array; null without r.
const uint8_t* random_bytes(const py::object& rh, const py::array& x, fp4::Rounding mode,
                            py::array& keep) {
  if (!rh.is_none()) {
    keep = checked_array(rh, "r", true, -1);
    if (shape_of(keep) != shape_of(x)) throw py::value_error("r must have the shape of x");
    return static_cast<const uint8_t*>(keep.data());
  }
  if (mode == fp4::Rounding::SR8)
    throw py::value_error("rounding='sr8' needs r, one random byte (uint8) per element of x");
  return nullptr;
}

py::array encode(const py::handle& xh, const std::string& fmt, const std::string& rounding,
                 const py::object& rh) {
  py::array x = checked_array(xh, "x", false, -1);
  const fp4::Rounding mode = parse_rounding(rounding, "rounding");
  const bool int_grid = is_int_grid(fmt);
  std::optional<fp4::ElementFormat> ef;
  const fp4::FloatFormat* ff = nullptr;
  if (int_grid) ef = fp4::parse_element_format(fmt); else ff = &fp4::parse_float_format(fmt);
  py::array ra;
  const uint8_t* r = random_bytes(rh, x, mode, ra);
  py::array_t<uint8_t> out = new_u8(shape_of(x));
  const float* xp = static_cast<const float*>(x.data());
  uint8_t* op = out.mutable_data();
  const int64_t n = x.size();
  {
    NoGil nogil;
    for (int64_t i = 0; i < n; ++i) {
      const uint8_t ri = r ? r[i] : 0;
      try {
        op[i] = int_grid ? fp4::element_encode(xp[i], *ef, mode, ri)
                         : fp4::format_encode(xp[i], *ff, mode, ri);
      } catch (const std::invalid_argument& e) {
        throw std::invalid_argument("x.flat[" + std::to_string(i) + "]: " + e.what());
      }
    }
  }
  return out;
}

py::array round_to(const py::handle& xh, const std::string& fmt, const std::string& rounding,
                   const py::object& rh) {
  // format_round of a float format (ints: decode(encode) is the grid value).
  py::array x = checked_array(xh, "x", false, -1);
  const fp4::Rounding mode = parse_rounding(rounding, "rounding");
  if (is_int_grid(fmt)) throw py::value_error("round_to: integer grids have no format_round; use decode(encode(x))");
  const fp4::FloatFormat& ff = fp4::parse_float_format(fmt);
  py::array ra;
  const uint8_t* r = random_bytes(rh, x, mode, ra);
  py::array_t<float> out = new_f32(shape_of(x));
  const float* xp = static_cast<const float*>(x.data());
  float* op = out.mutable_data();
  const int64_t n = x.size();
  {
    NoGil nogil;
    for (int64_t i = 0; i < n; ++i) {
      try {
        op[i] = fp4::format_round(xp[i], ff, mode, r ? r[i] : 0);
      } catch (const std::invalid_argument& e) {
        throw std::invalid_argument("x.flat[" + std::to_string(i) + "]: " + e.what());
      }
    }
  }
  return out;
}

py::array decode(const py::handle& ch, const std::string& fmt) {
  py::array c = checked_array(ch, "codes", true, -1);
  const bool int_grid = is_int_grid(fmt);
  std::optional<fp4::ElementFormat> ef;
  const fp4::FloatFormat* ff = nullptr;
  if (int_grid) ef = fp4::parse_element_format(fmt); else ff = &fp4::parse_float_format(fmt);
  py::array_t<float> out = new_f32(shape_of(c));
  const uint8_t* cp = static_cast<const uint8_t*>(c.data());
  float* op = out.mutable_data();
  const int64_t n = c.size();
  {
    NoGil nogil;
    for (int64_t i = 0; i < n; ++i) {
      try {
        op[i] = int_grid ? fp4::element_decode(cp[i], *ef) : fp4::format_decode(cp[i], *ff);
      } catch (const std::invalid_argument& e) {
        throw std::invalid_argument("codes.flat[" + std::to_string(i) + "]: " + e.what());
      }
    }
  }
  return out;
}

py::array sr_bytes(uint64_t seed, uint32_t step, uint32_t layer, uint32_t operand, uint32_t gemm,
                   uint32_t micro, uint64_t first, int64_t n) {
  if (n < 0) throw py::value_error("n must be >= 0, got " + std::to_string(n));
  fp4::SrKey k;
  k.seed = seed, k.step = step, k.layer = layer, k.operand = operand, k.gemm = gemm, k.micro = micro;
  py::array_t<uint8_t> out = new_u8({static_cast<py::ssize_t>(n)});
  uint8_t* op = out.mutable_data();
  {
    NoGil nogil;
    fp4::sr_bytes(k, first, static_cast<uint64_t>(n), op);
  }
  return out;
}

// ---- quantized tensors -------------------------------------------------------------------

/// A quantized operand: the unpacked QuantizedTensor (quantize()) or a packed QTensor file
/// (load_qtensor()), which is unpacked into the same fields.
struct BoundQTensor {
  fp4::QuantizedTensor q;
  bool has_amax = true;          ///< false when loaded from a file (block amax not stored)
  std::optional<fp4::QTensor> packed;  ///< set when loaded from a file
  std::map<std::string, std::string> facts;
};

fp4::SrKey sr_key_from(const py::object& key) {
  // Default: the CLI's key (fp4train quant: step 1, layer 0, operand 2 = dY, gemm 0).
  fp4::SrKey k;
  k.step = 1, k.layer = 0, k.operand = 2, k.gemm = 0, k.micro = 0;
  if (key.is_none()) return k;
  if (!py::isinstance<py::dict>(key))
    throw py::type_error("sr_key must be a dict with keys among step, layer, operand, gemm, micro; got " +
                         type_name(key));
  for (auto item : py::reinterpret_borrow<py::dict>(key)) {
    const std::string name = py::cast<std::string>(item.first);
    const int64_t v = py::cast<int64_t>(item.second);
    if (v < 0 || v > 0xFFFFFFFFll)
      throw py::value_error("sr_key['" + name + "'] must be in 0..2^32-1, got " + std::to_string(v));
    const uint32_t u = static_cast<uint32_t>(v);
    if (name == "step") k.step = u;
    else if (name == "layer") k.layer = u;
    else if (name == "operand") k.operand = u;
    else if (name == "gemm") k.gemm = u;
    else if (name == "micro") {
      if (u >= 65536) throw py::value_error("sr_key['micro'] must be < 65536, got " + std::to_string(v));
      k.micro = u;
    } else {
      throw py::value_error("sr_key: unknown key '" + name +
                            "' (valid keys: step, layer, operand, gemm, micro)");
    }
  }
  return k;
}

BoundQTensor quantize(const py::handle& xh, const std::string& element_format,
                   const std::string& scale_format, const std::string& scale_rule,
                   const std::string& four_over_six, int block,
                   bool two_d, float target, const py::object& reference,
                   const std::string& rounding, uint64_t seed, const py::object& sr_key,
                   bool check_finite) {
  py::array x = checked_array(xh, "x", false, 2);
  fp4::BlockQuantSpec spec;
  prefixed("scale_format: ", [&] { fp4::set_scale_format(spec, scale_format); return 0; });
  spec.element = prefixed("element_format: ", [&] { return fp4::parse_element_format(element_format); });
  spec.scale_rule = prefixed("scale_rule: ", [&] { return fp4::parse_scale_rule(scale_rule); });
  if (spec.scale_rule != fp4::ScaleRule::TensorScaled && fp4::spec_scale_format(spec).frac_bits != 0) {
    throw std::invalid_argument(std::string("scale_rule ") + fp4::scale_rule_name(spec.scale_rule) +
                                " needs a power-of-two scale format: pass scale_format='ue8m0' (got " +
                                fp4::spec_scale_format(spec).name + ")");
  }
  spec.four_over_six = prefixed("four_over_six: ", [&] { return fp4::parse_four_over_six(four_over_six); });
  if (spec.four_over_six != fp4::FourOverSix::Off && spec.scale_rule != fp4::ScaleRule::TensorScaled)
    throw std::invalid_argument("four_over_six='" + four_over_six + "' needs a tensor scale: leave "
                                "scale_rule='tensor-scaled' (docs/numerics.md \"Four Over Six\")");
  if (const std::string e = fp4::block_length_error(block); !e.empty())
    throw std::invalid_argument("block " + e);
  spec.block = block;
  spec.two_d = two_d;
  if (!(target > 0.f) || std::isinf(target))
    throw std::invalid_argument("target must be finite and > 0, got " + std::to_string(target));
  spec.target = target;
  spec.rounding = parse_rounding(rounding, "rounding");
  const bool ref_given = !reference.is_none();
  double ref = 0;
  if (ref_given) {
    ref = py::cast<double>(reference);
    if (!(ref >= 0.0) || std::isinf(ref) || ref > FLT_MAX)
      throw std::invalid_argument("reference must be finite and >= 0, got " + py::cast<std::string>(py::repr(reference)));
  }
  fp4::SrKey key = sr_key_from(sr_key);
  key.seed = seed;
  const int64_t rows = x.shape(0), cols = x.shape(1);
  const float* xp = static_cast<const float*>(x.data());
  BoundQTensor out;
  try {
    NoGil nogil;
    const float g = ref_given ? static_cast<float>(ref) : fp4::tensor_amax(xp, rows * cols);
    out.q = fp4::quantize_blocks(xp, rows, cols, spec, g, &key);
    if (check_finite) {
      std::vector<float> deq(static_cast<size_t>(rows * cols));
      fp4::dequantize(out.q, deq.data());
      fp4::check_dequantized_finite("quantize", out.q, xp, deq.data());
    }
  } catch (const fp4::NonFiniteError&) {
    require_finite(x, "x", "quantize needs finite values");
    throw;  // a result that dequantizes to +-Inf (check_finite), not an input
  }
  out.facts = {{"source", "fp4train python"}, {"rounding", rounding}};
  if (spec.rounding == fp4::Rounding::SR8) out.facts["seed"] = std::to_string(seed);
  if (spec.four_over_six != fp4::FourOverSix::Off) out.facts["four_over_six"] = four_over_six;
  return out;
}

BoundQTensor load_qtensor(const std::filesystem::path& file) {
  BoundQTensor out;
  {
    NoGil nogil;
    fp4::QTensor t = fp4::load_safetensors(file);
    fp4::QuantizedTensor& q = out.q;
    q.rows = t.rows, q.cols = t.cols;
    q.spec.block = t.block;
    q.spec.two_d = t.two_d;
    q.spec.scale_format = t.scale_format;
    q.spec.scale_rule = t.scale_rule;
    q.spec.element = fp4::parse_element_format(t.element_format);
    q.spec.target = t.target;
    q.g = t.reference;
    q.gd = t.decode_scale;
    // The encode scale as quantize_blocks sets it (fp4/numerics/block_quant.h), so that the
    // probe-matched GEMM accepts the operand; the MX rules have no tensor scale.
    if (t.scale_rule == fp4::ScaleRule::TensorScaled) {
      float ge = t.reference == 0.f ? 1.f : (t.target * q.spec.element.max()) / t.reference;
      q.ge = ge < FLT_MAX ? ge : FLT_MAX;
    } else {
      q.ge = 1.f;
    }
    q.block_rows = t.block_rows();
    q.block_cols = t.block_cols();
    q.scale_codes = t.scale_codes;
    q.scales.resize(t.scale_codes.size());
    for (size_t b = 0; b < t.scale_codes.size(); ++b)
      q.scales[b] = fp4::scale_decode(t.scale_codes[b], t.scale_format);
    q.codes.resize(static_cast<size_t>(t.rows * t.cols));
    for (int64_t i = 0; i < t.rows * t.cols; ++i) q.codes[static_cast<size_t>(i)] = t.code(i);
    // The element rounding is not part of the layout; `quant --save` and save() record it
    // as the fact "rounding".
    const auto rf = t.facts.find("rounding");
    if (rf != t.facts.end()) q.spec.rounding = fp4::parse_rounding_name(rf->second);
    out.facts = t.facts;
    out.packed = std::move(t);
  }
  out.has_amax = false;
  return out;
}

py::array qt_dequantize(const BoundQTensor& t) {
  py::array_t<float> out = new_f32({static_cast<py::ssize_t>(t.q.rows), static_cast<py::ssize_t>(t.q.cols)});
  float* op = out.mutable_data();
  {
    NoGil nogil;
    if (t.packed) fp4::dequantize(*t.packed, op); else fp4::dequantize(t.q, op);
  }
  return out;
}

void qt_save(const BoundQTensor& t, const std::filesystem::path& file, const py::object& facts) {
  std::map<std::string, std::string> f = t.facts;
  if (!facts.is_none()) {
    for (auto item : py::cast<py::dict>(facts)) f[py::cast<std::string>(item.first)] = py::cast<std::string>(item.second);
  }
  NoGil nogil;
  if (t.packed && facts.is_none()) {
    fp4::save_safetensors(*t.packed, file);
  } else {
    fp4::save_safetensors(fp4::pack(t.q, f), file);
  }
}

py::array grid_f32(const std::vector<float>& v, int64_t r, int64_t c) {
  py::array_t<float> a = new_f32({static_cast<py::ssize_t>(r), static_cast<py::ssize_t>(c)});
  if (!v.empty()) std::memcpy(a.mutable_data(), v.data(), v.size() * sizeof(float));
  return a;
}
py::array grid_u8(const std::vector<uint8_t>& v, int64_t r, int64_t c) {
  py::array_t<uint8_t> a = new_u8({static_cast<py::ssize_t>(r), static_cast<py::ssize_t>(c)});
  if (!v.empty()) std::memcpy(a.mutable_data(), v.data(), v.size());
  return a;
}

/// The accumulator of the probe-matched GEMM from Python's keyword arguments (checked).
fp4::Accumulator accumulator_of(int chunk, const std::string& accumulate, int snap) {
  fp4::Accumulator acc;
  acc.chunk = chunk;
  acc.snap = snap;
  acc.rounding = fp4::parse_accum_rounding(accumulate, "accumulate");
  acc.check();
  return acc;
}

py::array gemm(const BoundQTensor& a, const BoundQTensor& b, const std::string& mode_s, int chunk,
               const std::string& accumulate, int snap) {
  const fp4::GemmMode mode = prefixed("mode: ", [&] { return fp4::parse_gemm_mode(mode_s); });
  const fp4::Accumulator acc = accumulator_of(chunk, accumulate, snap);
  if (mode != fp4::GemmMode::ProbeMatched && !acc.is_default())
    throw std::invalid_argument("chunk, accumulate and snap describe the probe-matched GEMM's "
                                "accumulator; the decoded modes run no such accumulator");
  if (a.q.cols != b.q.cols) {
    throw std::invalid_argument("K mismatch: a is " + std::to_string(a.q.rows) + "x" +
                                std::to_string(a.q.cols) + " and b is " + std::to_string(b.q.rows) +
                                "x" + std::to_string(b.q.cols) +
                                "; C = A·Bᵀ needs the same number of columns K in both (b is [N, K], "
                                "not [K, N])");
  }
  py::array_t<float> c = new_f32({static_cast<py::ssize_t>(a.q.rows), static_cast<py::ssize_t>(b.q.rows)});
  float* cp = c.mutable_data();
  {
    NoGil nogil;
    prefixed("gemm: ", [&] {
      if (mode == fp4::GemmMode::ProbeMatched) {
        fp4::ProbeGemmOptions po;
        po.accumulator = acc;
        fp4::probe_gemm(a.q, b.q, cp, po);
      } else {
        fp4::quantized_gemm(mode, a.q, b.q, cp);
      }
      return 0;
    });
  }
  return c;
}

/// accumulate_partials(partials [rows, chunks] float32) -> float32 [rows].
py::array accumulate_partials_py(const py::handle& ph, const std::string& accumulate, int snap) {
  const py::array p = checked_array(ph, "partials", false, 2);
  const fp4::Accumulator acc = accumulator_of(64, accumulate, snap);
  const int64_t rows = p.shape(0), chunks = p.shape(1);
  py::array_t<float> out = new_f32({static_cast<py::ssize_t>(rows)});
  const float* pp = static_cast<const float*>(p.data());
  float* op = out.mutable_data();
  {
    NoGil nogil;
    fp4::accumulate_partials_rows(pp, rows, chunks, acc, op);
  }
  return out;
}

/// The row-pair operands of chunk_partials and chunked_dot: two C-contiguous 2-D arrays of one
/// shape [rows, K], both float32, or both uint16 holding BF16 bit patterns (then widened exactly
/// to float32 here). Raises TypeError / ValueError naming the problem.
struct RowPairs {
  py::array x, w;                  ///< as given
  std::vector<float> xf, wf;       ///< the widened BF16 values (empty for float32 input)
  int64_t rows = 0, K = 0;
  const float* xp() const { return xf.empty() ? static_cast<const float*>(x.data()) : xf.data(); }
  const float* wp() const { return wf.empty() ? static_cast<const float*>(w.data()) : wf.data(); }
};
RowPairs row_pairs(const py::handle& xh, const py::handle& wh) {
  auto is_u16 = [](const py::handle& h) {
    return py::isinstance<py::array>(h) &&
           py::reinterpret_borrow<py::array>(h).dtype().num() == py::dtype::of<uint16_t>().num();
  };
  const bool bf16 = is_u16(xh);
  if (bf16 != is_u16(wh))
    throw py::type_error("x and w must both be float32, or both uint16 (BF16 bit patterns)");
  RowPairs r;
  if (bf16) {
    r.x = py::reinterpret_borrow<py::array>(xh);
    r.w = py::reinterpret_borrow<py::array>(wh);
    for (const auto& [a, n] : {std::pair{r.x, "x"}, std::pair{r.w, "w"}}) {
      if (!(a.flags() & py::array::c_style) || a.ndim() != 2 || a.dtype().byteorder() == '>')
        throw py::value_error(std::string(n) + " (BF16 bits) must be a C-contiguous, native-order "
                              "2-D uint16 array [rows, K]");
    }
  } else {
    r.x = checked_array(xh, "x", false, 2);
    r.w = checked_array(wh, "w", false, 2);
  }
  if (r.x.shape(0) != r.w.shape(0) || r.x.shape(1) != r.w.shape(1))
    throw py::value_error("x and w must have the same shape [rows, K], got " +
                          std::string(py::str(py::tuple(py::cast(shape_of(r.x))))) + " and " +
                          std::string(py::str(py::tuple(py::cast(shape_of(r.w))))));
  r.rows = r.x.shape(0);
  r.K = r.x.shape(1);
  if (bf16) {  // BF16 → FP32 is exact: the bits are the high half
    const auto widen = [](const py::array& a, std::vector<float>& out) {
      const uint16_t* p = static_cast<const uint16_t*>(a.data());
      out.resize(static_cast<size_t>(a.size()));
      for (size_t i = 0; i < out.size(); ++i) out[i] = fp4::bf16_value(p[i]);
    };
    widen(r.x, r.xf);
    widen(r.w, r.wf);
  }
  return r;
}

/// chunk_partials(x [rows, K], w [rows, K]) -> float32 [rows, ceil(K / chunk)].
py::array chunk_partials_py(const py::handle& xh, const py::handle& wh, int chunk) {
  const RowPairs r = row_pairs(xh, wh);
  if (chunk != 16 && chunk != 32 && chunk != 64 && chunk != 128)
    throw py::value_error("chunk: expected 16, 32, 64 or 128 products, got " + std::to_string(chunk));
  const int64_t nc = (r.K + chunk - 1) / chunk;
  py::array_t<float> out = new_f32({static_cast<py::ssize_t>(r.rows), static_cast<py::ssize_t>(nc)});
  float* op = out.mutable_data();
  {
    NoGil nogil;
    fp4::chunk_partials_rows(r.xp(), r.wp(), r.rows, r.K, chunk, op);
  }
  return out;
}

/// chunked_dot(x [rows, K], w [rows, K]) -> float32 [rows]: float32 operands, or uint16 arrays
/// holding BF16 bit patterns.
py::array chunked_dot_py(const py::handle& xh, const py::handle& wh, int chunk,
                         const std::string& accumulate, int snap) {
  const fp4::Accumulator acc = accumulator_of(chunk, accumulate, snap);
  const RowPairs r = row_pairs(xh, wh);
  py::array_t<float> out = new_f32({static_cast<py::ssize_t>(r.rows)});
  float* op = out.mutable_data();
  {
    NoGil nogil;
    fp4::chunked_dot_rows(r.xp(), r.wp(), r.rows, r.K, acc, op);
  }
  return out;
}

// ---- recipes, configs, runs --------------------------------------------------------------

std::vector<fp4::Setting> settings_of(const std::vector<std::string>& sets, bool recipe) {
  if (sets.empty()) return {};
  fp4::Settings s = fp4::parse_settings(sets);
  if (recipe && !s.config.empty())
    throw fp4::UserError("sets: " + s.config.front().arg + " is a run-config key, not a recipe key");
  if (!recipe && !s.recipe.empty())
    throw fp4::UserError("sets: " + s.recipe.front().arg + " is a recipe key, not a run-config key");
  return recipe ? s.recipe : s.config;
}

struct BoundRecipe {
  fp4::Recipe r;
};
struct BoundConfig {
  fp4::RunConfig c;
  std::string source;
};

py::dict spec_dict(const fp4::BlockQuantSpec& s) {
  py::dict d;
  d["element_format"] = s.element.name();
  d["scale_format"] = fp4::spec_scale_format(s).name;
  d["scale_rule"] = fp4::scale_rule_name(s.scale_rule);
  d["block"] = s.block;
  d["two_d"] = s.two_d;
  d["target"] = s.target;
  d["rounding"] = fp4::rounding_name(s.rounding);
  if (s.four_over_six != fp4::FourOverSix::Off)  // only when on: earlier dicts are unchanged
    d["four_over_six"] = fp4::four_over_six_name(s.four_over_six);
  return d;
}

// The specs of an FP4 plan: {gemm: {operand: spec_dict}} over the pairs each GEMM quantizes.
py::dict plan_specs(const fp4::LinearPlan& p) {
  py::dict specs;
  for (int g = 0; g < 3; ++g) {
    py::dict ops;
    for (int o = 0; o < 3; ++o) {
      if (!fp4::gemm_uses(fp4::Gemm(g), fp4::Operand(o))) continue;
      ops[fp4::operand_name(fp4::Operand(o))] = spec_dict(p.specs[g][o]);
    }
    specs[fp4::gemm_name(fp4::Gemm(g))] = ops;
  }
  return specs;
}

// The per-linear plan of `recipe` on the model of `cfg`, whose plans `res` are resolved already
// (once: Recipe.plan resolves them, resolve_run's ResolvedRun holds them).
py::list plan_list(const fp4::Recipe& recipe, const fp4::RunConfig& cfg,
                   const fp4::ResolvedLinears& res) {
  const fp4::ModelInfo info = fp4::model_info(cfg, recipe, res);
  py::list out;
  for (size_t i = 0; i < info.linears.size(); ++i) {
    const fp4::LinearInfo& li = info.linears[i];
    py::dict d;
    d["name"] = li.name;
    d["block"] = li.block;
    d["kind"] = li.kind;
    d["shape"] = py::make_tuple(li.out, li.in);
    d["mode"] = fp4::linear_mode_name(li.mode);
    d["overrides"] = li.overrides;
    d["specs"] = i < res.plans.size() && li.mode == fp4::LinearMode::FP4 ? plan_specs(res.plans[i])
                                                                         : py::object(py::none());
    out.append(d);
  }
  return out;
}

py::list recipe_plan(const BoundRecipe& rec, const BoundConfig& cfg) {
  const std::vector<fp4::LinearSite> sites = fp4::nn::Model::linear_sites(cfg.c.model);
  return plan_list(rec.r, cfg.c, fp4::resolve_linear_plans(rec.r, sites, cfg.c.model.n_blocks()));
}

/// A run resolved as the fp4train commands resolve theirs (fp4::resolve_run).
struct BoundRun {
  fp4::ResolvedRun run;
};

BoundRun resolve_run_py(const std::string& config, const std::string& recipe,
                        const std::vector<std::string>& sets, const std::string& data) {
  fp4::RunRequest request;
  request.config = config;
  request.recipe = recipe;
  request.sets = sets;
  if (!data.empty()) request.taken.push_back({"data.path", "data"});
  request.data = data;
  request.with_data = !data.empty();
  BoundRun b;
  b.run = fp4::resolve_run(request);
  return b;
}

/// Checkpoint tensors by parameter name: the names and slices of nn::Model::param_infos() of
/// the model the checkpoint's config builds (one sequence of seq_len, nothing run).
struct BoundCheckpoint {
  fp4::Checkpoint ck;
  std::filesystem::path file;
  std::vector<fp4::nn::ParamInfo> infos;
};

BoundCheckpoint load_checkpoint_impl(const std::filesystem::path& path) {
  BoundCheckpoint out;
  NoGil nogil;
  std::string warn;
  out.file = fp4::resolve_checkpoint(path, &warn);
  out.ck = fp4::load_checkpoint(out.file);
  const fp4::RunConfig cfg = fp4::run_config_from_text(out.ck.config_toml, out.file.string() + " (config)");
  const fp4::Recipe rec = fp4::recipe_from_text(out.ck.recipe_toml, out.file.string() + " (recipe)");
  fp4::nn::Model model(cfg.model, rec, 1, cfg.train.seq_len);
  out.infos = model.param_infos();
  if (model.num_params() != static_cast<int64_t>(out.ck.params.size()))
    throw fp4::UserError(out.file.string() + ": the checkpoint holds " + std::to_string(out.ck.params.size()) +
                         " parameters, its config's model " + std::to_string(model.num_params()));
  return out;
}

py::dict named_tensors(const BoundCheckpoint& c, const std::vector<float>& buf) {
  py::dict d;
  if (buf.empty()) return d;
  for (const fp4::nn::ParamInfo& p : c.infos) {
    py::array_t<float> a = new_f32({static_cast<py::ssize_t>(p.rows), static_cast<py::ssize_t>(p.cols)});
    std::memcpy(a.mutable_data(), buf.data() + p.offset, static_cast<size_t>(p.size) * sizeof(float));
    d[py::str(p.name)] = a;
  }
  return d;
}

// ---- the C++ Linear (fp4train.torch.Linear runs it) ---------------------------------------

/// One fp4::nn::Linear with buffers of its own: X and W are copied at forward (the Linear
/// reads them again in backward), dW is zeroed before each backward (which accumulates).
struct BoundLinear {
  std::unique_ptr<fp4::nn::Linear> lin;
  int64_t K = 0, N = 0, M = 0;
  fp4::nn::AlignedFloats x, w, dw;
  bool pending = false;  ///< a training forward waits for its backward
  fp4::nn::StepContext fwd;
};

fp4::nn::StepContext step_context(int64_t step, uint64_t seed, int micro, bool training, bool telemetry) {
  if (step < 1) throw std::invalid_argument("step must be >= 1 (1-based optimizer step), got " + std::to_string(step));
  if (micro < 0 || micro >= 65536) throw std::invalid_argument("micro must be in 0..65535, got " + std::to_string(micro));
  fp4::nn::StepContext c;
  c.step = step, c.seed = seed, c.micro = micro, c.first_micro = micro == 0;
  c.hadamard_seed = seed;  // the Hadamard signs' run seed (fp4::hadamard_signs)
  c.training = training, c.telemetry = telemetry;
  return c;
}

/// One linear's resolved plan (fp4::LinearPlan), as resolve_linear_plans gives it.
struct BoundPlan {
  fp4::LinearPlan p;
};

BoundLinear make_linear_from_plan(int64_t in, int64_t out, const BoundPlan& plan, int layer) {
  if (in < 1 || out < 1) throw std::invalid_argument("in_features and out_features must be >= 1");
  if (layer < 0) throw std::invalid_argument("layer must be >= 0, got " + std::to_string(layer));
  BoundLinear b;
  b.K = in, b.N = out;
  b.lin = std::make_unique<fp4::nn::Linear>(layer, in, out, plan.p);
  b.w.resize(static_cast<size_t>(in * out));
  b.dw.resize(static_cast<size_t>(in * out));
  b.lin->bind(b.w.data(), b.dw.data());
  return b;
}

BoundLinear make_linear(int64_t in, int64_t out, const BoundRecipe& r, int layer, const std::string& mode) {
  fp4::LinearMode m = r.r.mode;
  if (mode == "fp32") m = fp4::LinearMode::FP32;
  else if (mode == "bf16") m = fp4::LinearMode::BF16;
  else if (mode == "fp4") m = fp4::LinearMode::FP4;
  else if (!mode.empty()) throw std::invalid_argument("mode: unknown value '" + mode + "' (valid choices: fp32, bf16, fp4, or '' for the recipe's)");
  return make_linear_from_plan(in, out, BoundPlan{fp4::LinearPlan::uniform(r.r, m)}, layer);
}

/// resolve_linear_plans on linears given as (block, kind) pairs: the rules of [linear],
/// [high_precision] and [[override]] for a model the caller describes (fp4train.torch.convert).
/// A kind is one of fp4::linear_kinds() or an alias of one (canonical_linear_kind), or "" for a
/// linear no override names.
py::tuple resolve_sites(const BoundRecipe& rec, const std::vector<std::pair<int, std::string>>& given,
                        int n_blocks) {
  if (n_blocks < 1) throw std::invalid_argument("n_blocks must be >= 1, got " + std::to_string(n_blocks));
  std::vector<fp4::LinearSite> sites;
  for (size_t i = 0; i < given.size(); ++i) {
    const auto& [block, kind] = given[i];
    const std::string at = "sites[" + std::to_string(i) + "]: ";
    if (block < 0 || block >= n_blocks)
      throw std::invalid_argument(at + "block " + std::to_string(block) + " is outside 0.." +
                                  std::to_string(n_blocks - 1));
    const std::string canon = kind.empty() ? "" : fp4::canonical_linear_kind(kind);
    if (!kind.empty() && canon.empty()) {
      std::string list;
      for (const auto& k : fp4::linear_kinds()) list += (list.empty() ? "" : ", ") + k;
      throw std::invalid_argument(at + "unknown linear kind '" + kind + "' (valid kinds: " + list +
                                  ", or '' for none)");
    }
    sites.push_back({block, canon});
  }
  const fp4::ResolvedLinears res = fp4::resolve_linear_plans(rec.r, sites, n_blocks);
  py::list plans;
  for (const fp4::LinearPlan& p : res.plans) plans.append(BoundPlan{p});
  return py::make_tuple(plans, res.override_hits);
}

py::array linear_forward(BoundLinear& b, const py::handle& xh, const py::handle& wh, int64_t step,
                         uint64_t seed, int micro, bool training, bool telemetry) {
  py::array x = checked_array(xh, "x", false, 2);
  py::array w = checked_array(wh, "weight", false, 2);
  if (x.shape(1) != b.K) throw py::value_error("x must be [M, " + std::to_string(b.K) + "], got [" + std::to_string(x.shape(0)) + ", " + std::to_string(x.shape(1)) + "]");
  if (w.shape(0) != b.N || w.shape(1) != b.K) throw py::value_error("weight must be [" + std::to_string(b.N) + ", " + std::to_string(b.K) + "]");
  if (training && b.pending)
    throw std::logic_error("Linear: a second training forward before the backward of the first (a "
                           "Linear keeps one forward's operands for its backward; use one Linear per call)");
  const fp4::nn::StepContext c = step_context(step, seed, micro, training, telemetry);
  const int64_t M = x.shape(0);
  py::array_t<float> y = new_f32({static_cast<py::ssize_t>(M), static_cast<py::ssize_t>(b.N)});
  float* yp = y.mutable_data();
  const float* xp = static_cast<const float*>(x.data());
  const float* wp = static_cast<const float*>(w.data());
  try {
    NoGil nogil;
    b.x.assign(xp, xp + M * b.K);
    std::memcpy(b.w.data(), wp, static_cast<size_t>(b.N * b.K) * sizeof(float));
    b.lin->forward(b.x.data(), yp, M, c);
  } catch (const fp4::NonFiniteError&) {  // a quantized (FP4) linear refuses NaN/Inf operands
    require_finite(x, "x", "Linear.forward needs finite inputs");
    require_finite(w, "weight", "Linear.forward needs finite weights");
    throw;
  }
  b.M = M;
  b.pending = training;
  b.fwd = c;
  return y;
}

py::tuple linear_backward(BoundLinear& b, const py::handle& dyh, bool need_dx) {
  if (!b.pending) throw std::logic_error("Linear: backward without a training forward");
  py::array dy = checked_array(dyh, "dy", false, 2);
  if (dy.shape(0) != b.M || dy.shape(1) != b.N)
    throw py::value_error("dy must be [" + std::to_string(b.M) + ", " + std::to_string(b.N) + "] (the forward's [M, N])");
  py::object dxo = py::none();
  float* dxp = nullptr;
  if (need_dx) {
    py::array_t<float> dx = new_f32({static_cast<py::ssize_t>(b.M), static_cast<py::ssize_t>(b.K)});
    dxp = dx.mutable_data();
    std::memset(dxp, 0, static_cast<size_t>(b.M * b.K) * sizeof(float));
    dxo = dx;
  }
  py::array_t<float> dw = new_f32({static_cast<py::ssize_t>(b.N), static_cast<py::ssize_t>(b.K)});
  const float* dyp = static_cast<const float*>(dy.data());
  try {
    NoGil nogil;
    std::fill(b.dw.begin(), b.dw.end(), 0.f);
    b.lin->backward(dyp, dxp, b.M, b.fwd);
    std::memcpy(dw.mutable_data(), b.dw.data(), b.dw.size() * sizeof(float));
  } catch (const fp4::NonFiniteError&) {
    require_finite(dy, "dy", "Linear.backward needs a finite upstream gradient");
    throw;
  }
  b.pending = false;
  return py::make_tuple(dxo, dw);
}

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "fp4train C++ core (pybind11). Use the `fp4train` package, not this module.";
  py::options options;
  options.disable_function_signatures();  // every docstring starts with its own signature
  py::register_exception<fp4::UserError>(m, "UserError", PyExc_ValueError);

  m.def("named_formats", &named_formats,
        "named_formats() -> list[str]\n\nThe named float formats of docs/formats.md, in its order "
        "(e2m1, e1m2, ..., ue8m0). Spelled formats [u]e<E>m<M> and integer grids int<N>[-sym] are "
        "accepted by every function too.");
  m.def("format_info", &format_info, "name"_a,
        "format_info(name) -> dict\n\nDescriptor of a format (docs/formats.md): for floats name, bits, "
        "signed, exp_bits, frac_bits, bias, max_finite, max_code, min_normal, min_subnormal, "
        "subnormals, reserved_top; for integer grids name, bits, min, max, max_finite.\n"
        "Raises ValueError for an unknown name (the message lists the valid choices).");
  m.def("encode", &encode, "x"_a, "fmt"_a, "rounding"_a = "rne", "r"_a = py::none(),
        "encode(x, fmt, rounding='rne', r=None) -> numpy.ndarray[uint8]\n\n"
        "Round every element of x (float32 ndarray, any shape, C-contiguous) onto format `fmt` and "
        "return its codes (uint8, same shape): fp4::format_encode for float formats (signed: "
        "sign in the top bit of the code, -0 for negative values rounding to 0), "
        "fp4::element_encode for integer grids (two's complement, no -0). rounding: 'rne', 'rna' (ties away "
        "from zero) or 'sr8' (8-bit stochastic rounding; r: uint8 array of x's shape, the random byte of each "
        "element). Values beyond the format saturate to +-max_finite.\n"
        "Raises TypeError (x not a float32 ndarray, r not uint8), ValueError (not C-contiguous, "
        "unknown format, NaN, a negative value in an unsigned format, 0 in ue8m0, sr8 without r; "
        "the message starts with the element's flat index).");
  m.def("round_to", &round_to, "x"_a, "fmt"_a, "rounding"_a = "rne", "r"_a = py::none(),
        "round_to(x, fmt, rounding='rne', r=None) -> numpy.ndarray[float32]\n\n"
        "fp4::format_round of every element of x (float32, any shape) onto float format `fmt`: "
        "the value decode(encode(x)) without the code. Same arguments and errors as encode; "
        "integer grids are refused (ValueError).");
  m.def("decode", &decode, "codes"_a, "fmt"_a,
        "decode(codes, fmt) -> numpy.ndarray[float32]\n\n"
        "Decode codes (uint8 ndarray, any shape, C-contiguous) of format `fmt` "
        "(fp4::format_decode / fp4::element_decode). Raises TypeError for a non-uint8 array and "
        "ValueError for codes wider than the format or reserved (NaN/Inf) codes, naming the "
        "flat index.");
  m.def("sr_bytes", &sr_bytes, "seed"_a, "step"_a, "layer"_a, "operand"_a, "gemm"_a, "micro"_a,
        "first"_a, "n"_a,
        "sr_bytes(seed, step, layer, operand, gemm, micro, first, n) -> numpy.ndarray[uint8]\n\n"
        "The SR random bytes first..first+n-1 of one Philox4x32-10 stream (fp4/numerics/philox.h "
        "sr_byte): the bytes quantize(rounding='sr8') uses, element i of the operand taking byte "
        "i. Raises ValueError for n < 0.");

  py::class_<BoundQTensor>(m, "QTensor",
      "A block-quantized 2-D tensor [rows, cols] (fp4::QuantizedTensor), from quantize() or "
      "load_qtensor(). Arrays returned are copies.")
      .def_property_readonly("shape", [](const BoundQTensor& t) { return py::make_tuple(t.q.rows, t.q.cols); },
                             "(rows, cols)")
      .def_property_readonly("codes", [](const BoundQTensor& t) { return grid_u8(t.q.codes, t.q.rows, t.q.cols); },
                             "Element codes, uint8 [rows, cols] (E2M1: 4 bits, sign in bit 3; other "
                             "floats: sign in the top bit of their width; integers: two's complement).")
      .def_property_readonly("scale_codes", [](const BoundQTensor& t) {
            return grid_u8(t.q.scale_codes, t.q.block_rows, t.q.block_cols); },
                             "Block-scale codes c_b in the scale format, uint8 [block_rows, block_cols].")
      .def_property_readonly("scales", [](const BoundQTensor& t) {
            return grid_f32(t.q.scales, t.q.block_rows, t.q.block_cols); },
                             "Decoded block scales c_b (after the zero-block guard c_b = 1), float32 "
                             "[block_rows, block_cols].")
      .def_property_readonly("decode_scales", [](const BoundQTensor& t) {
            std::vector<float> d(t.q.scales.size());
            for (size_t b = 0; b < d.size(); ++b) d[b] = t.q.scales[b] * t.q.gd;
            return grid_f32(d, t.q.block_rows, t.q.block_cols); },
                             "Per-block decode scales d_b = c_b * gd (FP32 product), float32 "
                             "[block_rows, block_cols]: x_hat = element value * d_b.")
      .def_property_readonly("block_amax", [](const BoundQTensor& t) -> py::object {
            if (!t.has_amax) return py::none();
            return grid_f32(t.q.block_amax, t.q.block_rows, t.q.block_cols); },
                             "Block amax a_b, float32 [block_rows, block_cols]; None for a tensor "
                             "loaded from a file (not stored there).")
      .def_property_readonly("g", [](const BoundQTensor& t) { return t.q.g; }, "Tensor reference amax g used.")
      .def_property_readonly("ge", [](const BoundQTensor& t) { return t.q.ge; }, "Tensor encode scale ge.")
      .def_property_readonly("gd", [](const BoundQTensor& t) { return t.q.gd; }, "Tensor decode scale gd = 1/ge.")
      .def_property_readonly("block", [](const BoundQTensor& t) { return t.q.spec.block; }, "Block length / tile side.")
      .def_property_readonly("two_d", [](const BoundQTensor& t) { return t.q.spec.two_d; }, "block x block tiles.")
      .def_property_readonly("target", [](const BoundQTensor& t) { return t.q.spec.target; }, "Scale target T.")
      .def_property_readonly("element_format", [](const BoundQTensor& t) { return t.q.spec.element.name(); }, "Element format name (docs/formats.md).")
      .def_property_readonly("scale_format", [](const BoundQTensor& t) { return std::string(fp4::spec_scale_format(t.q.spec).name); }, "Block-scale format name.")
      .def_property_readonly("scale_rule", [](const BoundQTensor& t) { return std::string(fp4::scale_rule_name(t.q.spec.scale_rule)); }, "Scale rule: tensor-scaled, mx-te or mx-ocp.")
      .def_property_readonly("rounding", [](const BoundQTensor& t) { return std::string(fp4::rounding_name(t.q.spec.rounding)); }, "Element rounding: rne, sr8 or rna.")
      .def_property_readonly("facts", [](const BoundQTensor& t) { return t.facts; },
                             "The metadata facts stored with save() (source, rounding, seed, ...).")
      .def("dequantize", &qt_dequantize,
           "dequantize() -> numpy.ndarray[float32] [rows, cols]\n\nx_hat = q * (c_b * gd) "
           "(fp4::dequantize; for a loaded file the packed dequantize, bit-identical).")
      .def("save", &qt_save, "path"_a, "facts"_a = py::none(),
           "save(path, facts=None)\n\nWrite the packed QTensor safetensors file (fp4/numerics/qtensor.h; the "
           "file `fp4train quant --save` writes): two E2M1 codes per byte, one scale byte per "
           "block. facts: extra metadata strings. Raises ValueError for a spec that cannot be "
           "packed (elements other than e2m1, scale formats outside ue5m3/ue5m3-ptx/e4m3/ue8m0) "
           "and fp4train.UserError if the file cannot be written.")
      .def("__repr__", [](const BoundQTensor& t) {
        return "<fp4train.QTensor [" + std::to_string(t.q.rows) + ", " + std::to_string(t.q.cols) +
               "] " + t.q.spec.element.name() + "/" + fp4::spec_scale_format(t.q.spec).name + " " +
               fp4::scale_rule_name(t.q.spec.scale_rule) + " block " + std::to_string(t.q.spec.block) +
               (t.q.spec.two_d ? " 2-D" : "") + ">";
      });

  m.def("quantize", &quantize, "x"_a, py::kw_only(), "element_format"_a = "e2m1",
        "scale_format"_a = "ue5m3", "scale_rule"_a = "tensor-scaled", "four_over_six"_a = "off",
        "block"_a = 16,
        "two_d"_a = false, "target"_a = 448.f, "reference"_a = py::none(), "rounding"_a = "rne",
        "seed"_a = 0, "sr_key"_a = py::none(), "check_finite"_a = true,
        "quantize(x, *, element_format='e2m1', scale_format='ue5m3', scale_rule='tensor-scaled', "
        "four_over_six='off', block=16, two_d=False, target=448.0, reference=None, rounding='rne', seed=0, sr_key=None, "
        "check_finite=True) -> QTensor\n\n"
        "Block-quantize x (float32 ndarray [rows, cols], C-contiguous) exactly as `fp4train quant` "
        "(fp4::quantize_blocks, docs/numerics.md \"Quantizing one operand\", docs/formats.md): blocks "
        "of `block` along the last dim (two_d: block x block tiles), tensor reference g = "
        "`reference` or max|x|, scale target T = target, element rounding 'rne', 'sr8' or 'rna'. SR bytes "
        "come from the Philox key (seed, step, layer, operand, gemm, micro); sr_key: dict "
        "overriding the CLI's key (step 1, layer 0, operand 2, gemm 0, micro 0). check_finite: "
        "refuse a result that dequantizes to +-Inf (mx-te near FLT_MAX), as the CLI does. "
        "four_over_six: 'off', 'mae' or 'mse' (docs/numerics.md \"Four Over Six\": each block keeps "
        "the lower-error of its amax mapped to 6 and to 4; needs the tensor-scaled rule).\n"
        "Raises TypeError (not a float32 ndarray), ValueError (not 2-D or C-contiguous, NaN/Inf in "
        "x, unknown format/rule names, block <= 0, bad target/reference, sr_key keys).");
  m.def("load_qtensor", &load_qtensor, "path"_a,
        "load_qtensor(path) -> QTensor\n\nRead a packed QTensor safetensors file (QTensor.save, "
        "`fp4train quant --save`). block_amax is None (not stored). Raises fp4train.UserError "
        "naming the file and what is wrong.");
  m.def("gemm_quantized", &gemm, "a"_a, "b"_a, "mode"_a = "probe-matched", "chunk"_a = 64,
        "accumulate"_a = "rtz", "snap"_a = 1024,
        "gemm_quantized(a, b, mode='probe-matched', chunk=64, accumulate='rtz', snap=1024) -> "
        "numpy.ndarray[float32] [M, N]\n\n"
        "C = A·Bᵀ of two QTensors A [M, K], B [N, K] quantized along K (fp4::quantized_gemm: "
        "'decoded' = dequantize + FP32 oneDNN GEMM, 'probe-matched' = the native FP4 GEMM's "
        "arithmetic, docs/gemm.md). chunk (16, 32, 64, 128), accumulate ('rtz', 'rne') and snap "
        "(0 = none, or a power of two d: the grid 1/d) set the probe-matched GEMM's accumulator "
        "(fp4/gemm/accumulator.h). Raises ValueError on a K mismatch, an unknown mode, a bad "
        "accumulator, or operands the probe-matched mode cannot take (non-E2M1 elements).");
  m.def("accumulate_partials", &accumulate_partials_py, "partials"_a, "accumulate"_a = "rtz",
        "snap"_a = 1024,
        "accumulate_partials(partials, accumulate='rtz', snap=1024) -> numpy.ndarray[float32] [rows]\n\n"
        "The probe-matched GEMM's accumulation of given FP32 chunk partials [rows, chunks] "
        "(float32, C-contiguous): per row, from +0, in order, FP32 additions rounded 'rtz' "
        "(toward zero) or 'rne'; then the snap RNE(d·acc)/d (snap=0: none). The same code as "
        "probe_gemm's (fp4::accumulate_partials_rows, docs/gemm.md \"The accumulator\"). "
        "Non-finite partials follow IEEE arithmetic (a NaN partial gives a NaN result; Inf − Inf "
        "is NaN), as in the GEMM. Raises TypeError / ValueError for a bad array or accumulator.");
  m.def("chunk_partials", &chunk_partials_py, "x"_a, "w"_a, "chunk"_a = 64,
        "chunk_partials(x, w, chunk=64) -> numpy.ndarray[float32] [rows, ceil(K / chunk)]\n\n"
        "The chunk sums of row-wise dot products: partials[i, c] = the exact sum of x[i,k]·w[i,k] "
        "over chunk c (k in [c·chunk, (c+1)·chunk)), rounded once to FP32 (RNE). x, w: float32 "
        "[rows, K], or uint16 [rows, K] holding BF16 bit patterns; chunk 16, 32, 64 or 128. "
        "accumulate_partials(chunk_partials(x, w, c), ...) equals chunked_dot(x, w, c, ...). "
        "Raises TypeError / ValueError for bad arrays (non-finite values named by row and "
        "element) or chunk.");
  m.def("chunked_dot", &chunked_dot_py, "x"_a, "w"_a, "chunk"_a = 64, "accumulate"_a = "rtz",
        "snap"_a = 1024,
        "chunked_dot(x, w, chunk=64, accumulate='rtz', snap=1024) -> numpy.ndarray[float32] [rows]\n\n"
        "Row-wise dot products sum_k x[i,k]·w[i,k] with the native GEMM's accumulator: chunks of "
        "`chunk` products (16, 32, 64, 128), each chunk's exact sum rounded once to FP32 (RNE), "
        "the chunk sums accumulated as accumulate_partials does. x, w: float32 [rows, K], or "
        "uint16 [rows, K] holding BF16 bit patterns (widened exactly). Raises TypeError / "
        "ValueError for bad arrays (non-finite values named by row and element) or a bad "
        "accumulator.");
  m.def("probe_gemm_alpha", [](const BoundQTensor& a, const BoundQTensor& b) { return fp4::probe_gemm_alpha(a.q, b.q); },
        "a"_a, "b"_a,
        "probe_gemm_alpha(a, b) -> float\n\nalpha = fl(g_a*g_b) / fl(fl(T_a*6)*fl(T_b*6)), the factor "
        "of the probe-matched GEMM (1 for two MX operands).");

  py::class_<BoundConfig>(m, "Config", "A run config (fp4::RunConfig), e.g. configs/tiny.toml.")
      .def_static("load", [](const std::filesystem::path& p, const std::vector<std::string>& sets) {
            BoundConfig c;
            c.c = fp4::load_run_config(p, settings_of(sets, false));
            c.source = p.string();
            return c; }, "path"_a, "sets"_a = std::vector<std::string>{},
          "Config.load(path, sets=[]) -> Config\n\nParse and validate a run-config TOML file; sets: "
          "'KEY=VALUE' overrides as `--set`. Raises fp4train.UserError naming the file and key.")
      .def_static("from_toml", [](const std::string& text, const std::string& where) {
            BoundConfig c;
            c.c = fp4::run_config_from_text(text, where);
            c.source = where;
            return c; }, "text"_a, "where"_a = "<text>",
          "Config.from_toml(text, where='<text>') -> Config\n\nParse run-config TOML text.")
      .def_property_readonly("toml", [](const BoundConfig& c) { return fp4::run_config_to_toml(c.c); },
                             "The resolved config as TOML text (what a run writes as config.toml).")
      .def_property_readonly("pattern", [](const BoundConfig& c) { return c.c.model.block_pattern(); }, "The block pattern (model.pattern, or '*-' repeated n_layers times).")
      .def_property_readonly("source", [](const BoundConfig& c) { return c.source; }, "The file (or text label) the config came from.")
      .def("__repr__", [](const BoundConfig& c) {
            const fp4::ModelConfig& m = c.c.model;
            const fp4::TrainConfig& t = c.c.train;
            return "<fp4train.Config " + c.source + ": pattern " + m.block_pattern() +
                   ", d_model " + std::to_string(m.d_model) + ", vocab " +
                   std::to_string(m.vocab_size) + "; " + std::to_string(t.batch_size) + " x " +
                   std::to_string(t.seq_len) + " tokens per step, " + std::to_string(t.steps) +
                   " steps, lr " + py::str(py::float_(t.lr)).cast<std::string>() + ", seed " +
                   std::to_string(t.seed) + " (.toml: the whole config)>"; });

  py::class_<BoundRecipe>(m, "Recipe", "A training recipe (fp4::Recipe), e.g. configs/recipes/ue5m3-b16.toml.")
      .def_static("load", [](const std::string& name_or_path, const std::vector<std::string>& sets,
                             const std::filesystem::path& recipes_dir) {
            BoundRecipe r;
            r.r = fp4::load_recipe(name_or_path, recipes_dir, settings_of(sets, true));
            return r; }, "name_or_path"_a, "sets"_a = std::vector<std::string>{},
          "recipes_dir"_a = std::filesystem::path(FP4_SOURCE_DIR) / "configs" / "recipes",
          "Recipe.load(name_or_path, sets=[], recipes_dir=<source>/configs/recipes) -> Recipe\n\n"
          "A recipe file, or a recipe name looked up in recipes_dir; sets: 'KEY=VALUE' overrides "
          "as `--set`. Raises fp4train.UserError naming the file and key (or listing the names).")
      .def_static("from_toml", [](const std::string& text, const std::string& where) {
            BoundRecipe r;
            r.r = fp4::recipe_from_text(text, where);
            return r; }, "text"_a, "where"_a = "<text>",
          "Recipe.from_toml(text, where='<text>') -> Recipe\n\nParse recipe TOML text.")
      .def_property_readonly("name", [](const BoundRecipe& r) { return r.r.name; }, "[name]")
      .def_property_readonly("description", [](const BoundRecipe& r) { return r.r.description; }, "[description]")
      .def_property_readonly("mode", [](const BoundRecipe& r) { return std::string(fp4::linear_mode_name(r.r.mode)); }, "[linear] mode: fp32, bf16 or fp4.")
      .def_property_readonly("gemm", [](const BoundRecipe& r) { return std::string(fp4::gemm_mode_name(r.r.gemm)); }, "[linear] gemm as resolved: decoded, probe-matched or decoded-bf16 (a recipe's \"auto\" is resolved when it is read).")
      .def_property_readonly("element_format", [](const BoundRecipe& r) { return r.r.element_format.name(); }, "[fp4] element_format.")
      .def_property_readonly("scale_format", [](const BoundRecipe& r) { return r.r.scale_format_str(); }, "[fp4] scale_format.")
      .def_property_readonly("scale_rule", [](const BoundRecipe& r) { return std::string(fp4::scale_rule_name(r.r.scale_rule)); }, "[fp4] scale_rule.")
      .def_property_readonly("block", [](const BoundRecipe& r) { return r.r.block; }, "[fp4] block.")
      .def_property_readonly("weight_block", [](const BoundRecipe& r) { return r.r.weight_block_size(); },
                             "[fp4] weight_block: block length (tile side with weight_2d) of the weight W in "
                             "fprop and dgrad; equals block unless the recipe sets it (docs/recipes.md).")
      .def_property_readonly("weight_2d", [](const BoundRecipe& r) { return r.r.weight_2d; }, "[fp4] weight_2d: weights in weight_block x weight_block tiles.")
      .def_property_readonly("scale_target", [](const BoundRecipe& r) { return r.r.scale_target; }, "[fp4] scale_target T.")
      .def_property_readonly("amax_interval", [](const BoundRecipe& r) { return r.r.amax_interval; }, "[fp4] amax_interval D (1: current scaling).")
      .def_property_readonly("rht_wgrad", [](const BoundRecipe& r) { return r.r.rht_wgrad; }, "[fp4] rht_wgrad: 16-point RHT on the wgrad operands.")
      .def_property_readonly("hadamard_size", [](const BoundRecipe& r) { return r.r.hadamard_size; },
                             "[fp4] hadamard_size: points n of the Hadamard transforms (16, 32, 64, 128).")
      .def_property_readonly("hadamard_gemms", [](const BoundRecipe& r) {
            std::vector<std::string> g;
            if (r.r.hadamard_dgrad) g.push_back("dgrad");
            if (r.r.rht_wgrad) g.push_back("wgrad");
            return g; },
          "[fp4] hadamard_gemms: the backward GEMMs whose operands are transformed, a list among "
          "'dgrad', 'wgrad' ('wgrad' is rht_wgrad).")
      .def_property_readonly("hadamard_signs", [](const BoundRecipe& r) { return std::string(fp4::hadamard_signs_name(r.r.hadamard_signs)); },
                             "[fp4] hadamard_signs: 'fixed', 'per-layer', 'per-step' or 'per-call' (docs/numerics.md).")
      .def_property_readonly("forward_quantizer", [](const BoundRecipe& r) { return std::string(fp4::forward_quantizer_name(r.r.forward_quantizer)); },
                             "[fp4] forward_quantizer: 'blocks' or 'quartet2-rtn' (Quartet II's forward quantizer; docs/recipes.md \"Quartet II's quantizers\").")
      .def_property_readonly("backward_quantizer", [](const BoundRecipe& r) { return std::string(fp4::backward_quantizer_name(r.r.backward_quantizer)); },
                             "[fp4] backward_quantizer: 'blocks' or 'ms-eden' (Quartet II's MS-EDEN backward; docs/recipes.md \"Quartet II's quantizers\").")
      .def_property_readonly("bf16_boundary", [](const BoundRecipe& r) { return r.r.bf16_boundary; }, "[fp4] bf16_boundary.")
      .def_property_readonly("bf16_outputs", [](const BoundRecipe& r) { return r.r.bf16_outputs; }, "[fp4] bf16_outputs: Y and each linear's dX rounded to BF16.")
      .def_property_readonly("four_over_six", [](const BoundRecipe& r) { return std::string(fp4::four_over_six_roles_name(r.r.four_over_six)); },
                             "[fp4] four_over_six: the operands whose block scales Four Over Six chooses: none, weights, activations, gradients or all (docs/recipes.md \"Four Over Six\").")
      .def_property_readonly("four_over_six_error", [](const BoundRecipe& r) { return std::string(fp4::four_over_six_name(r.r.four_over_six_error)); },
                             "[fp4] four_over_six_error: 'mae' or 'mse'.")
      .def_property_readonly("four_over_six_scale_target", [](const BoundRecipe& r) {
            return r.r.four_over_six_scale_target > 0.f ? r.r.four_over_six_scale_target : r.r.scale_target; },
                             "[fp4] four_over_six_scale_target: T of the Four Over Six operands (scale_target unless set).")
      .def_property_readonly("row_scaled_activation", [](const BoundRecipe& r) { return r.r.row_scaled_activation; },
                             "[fp4] row_scaled_activation: X (fprop) and Xt (wgrad) with one current "
                             "tensor reference per row (docs/numerics.md \"Per-row reference\").")
      .def_property_readonly("probe_snap", [](const BoundRecipe& r) { return r.r.probe_snap; }, "[linear] probe_snap: the probe-matched GEMM's snap grid 1/d (0 = none).")
      .def_property_readonly("toml", [](const BoundRecipe& r) { return fp4::recipe_to_toml(r.r); },
                             "The recipe as TOML text (recipe_to_toml: what a run writes as recipe.toml).")
      .def("__repr__", [](const BoundRecipe& b) {
            const fp4::Recipe& r = b.r;
            std::string s = "<fp4train.Recipe " + r.name + ": " + fp4::linear_mode_name(r.mode);
            if (r.mode == fp4::LinearMode::FP4) {
              s += " " + r.element_format.name() + ", " + r.scale_format_str() + " scales, block " +
                   std::to_string(r.block) +
                   (r.weight_block_size() != r.block ? ", weight block " + std::to_string(r.weight_block_size()) : "") +
                   (r.weight_2d ? " (2-D weights)" : "") + ", D " +
                   std::to_string(r.amax_interval) + ", RHT " + (r.rht_wgrad ? "on" : "off") +
                   ", " + std::to_string(r.overrides.size()) + " overrides";
              if (r.gemm != fp4::GemmMode::Decoded) s += std::string(", gemm ") + fp4::gemm_mode_name(r.gemm);
              if (r.row_scaled_activation) s += ", row-scaled X";
            }
            return s + " (.toml: the whole recipe)>"; })
      .def("spec", [](const BoundRecipe& r, const std::string& role) {
            if (role == "x") return spec_dict(r.r.spec_x());
            if (role == "w") return spec_dict(r.r.spec_w());
            if (role == "dy") return spec_dict(r.r.spec_dy());
            throw std::invalid_argument("spec: role must be 'x', 'w' or 'dy', got '" + role + "'"); },
           "role"_a,
           "spec(role) -> dict\n\nThe recipe's block-quantization spec of role 'x', 'w' or 'dy' "
           "before overrides (element_format, scale_format, scale_rule, block, two_d, target, "
           "rounding): keyword arguments of quantize(). Raises ValueError for another role.")
      .def("plan", &recipe_plan, "config"_a,
           "plan(config) -> list[dict]\n\nThe resolved per-linear plan of this recipe on the model of "
           "`config` (a Config), as `fp4train info` shows it: one dict per linear in model order, "
           "then lm_head: name ('layers.N.mixer.<kind>'), block, kind, shape (out, in), mode "
           "('fp32'|'bf16'|'fp4', after [high_precision] and [[override]]), overrides (indices of "
           "the overrides that changed it), specs (FP4 linears: {gemm: {operand: spec dict}} for "
           "fprop x/w, dgrad dy/w, wgrad dy/x; else None). Raises fp4train.UserError when the "
           "recipe does not fit the model.");

  py::class_<BoundRun>(m, "ResolvedRun",
                       "A run as the fp4train commands resolve it (resolve_run): the config with "
                       "its overrides, the recipe and its per-linear plan, and the run's label.")
      .def_property_readonly("label", [](const BoundRun& b) { return b.run.label; },
                             "The run's label: the config's stem and its result-changing "
                             "overrides, 'tiny+train.lr=0.001' (what train names runs by).")
      .def_property_readonly("config", [](const BoundRun& b) {
            BoundConfig c;
            c.c = b.run.config;
            c.source = b.run.config_where;
            return c; }, "The resolved Config (overrides applied, validated).")
      .def_property_readonly("recipe", [](const BoundRun& b) { return BoundRecipe{b.run.recipe}; },
                             "The resolved Recipe (overrides applied).")
      .def_property_readonly("data_path", [](const BoundRun& b) { return b.run.data.path; },
                             "The corpus of the run when `data` was given, else an empty path.")
      .def("plan", [](const BoundRun& b) { return plan_list(b.run.recipe, b.run.config, b.run.plans); },
           "plan() -> list[dict]\n\nThe per-linear plan resolved with the run, as "
           "Recipe.plan(config) gives it.")
      .def("__repr__", [](const BoundRun& b) {
            return "<fp4train.ResolvedRun " + b.run.label + ", recipe " + b.run.recipe.name + ">"; });
  m.def("resolve_run", &resolve_run_py, "config"_a, "recipe"_a = "ue5m3-b16",
        "sets"_a = std::vector<std::string>{}, "data"_a = "",
        "resolve_run(config, recipe='ue5m3-b16', sets=[], data='') -> ResolvedRun\n\n"
        "Resolve a run exactly as `fp4train train --config CONFIG --recipe RECIPE --set ... "
        "--data DATA` does: config found relative to the working directory, then the source "
        "tree; recipe a shipped name or a .toml path; sets 'KEY=VALUE' overrides of config and "
        "recipe keys; data the corpus instead of data.path (checked to exist; '' = not "
        "resolved). Raises fp4train.UserError naming the argument, file and key at fault.");

  py::class_<BoundCheckpoint>(m, "Checkpoint", "A training checkpoint (fp4/train/checkpoint.h).")
      .def_property_readonly("file", [](const BoundCheckpoint& c) { return c.file; }, "The checkpoint file read.")
      .def_property_readonly("step", [](const BoundCheckpoint& c) { return c.ck.step; }, "Completed optimizer steps.")
      .def_property_readonly("config_toml", [](const BoundCheckpoint& c) { return c.ck.config_toml; }, "The run config as TOML text (Config.from_toml reads it).")
      .def_property_readonly("recipe_toml", [](const BoundCheckpoint& c) { return c.ck.recipe_toml; }, "The recipe as TOML text (Recipe.from_toml reads it).")
      .def_property_readonly("params", [](const BoundCheckpoint& c) { return named_tensors(c, c.ck.params); },
                             "FP32 master weights by parameter name (embeddings, layers.N.norm, "
                             "layers.N.mixer.<name>, norm_f, lm_head), float32 [rows, cols] each.")
      .def_property_readonly("adam_m", [](const BoundCheckpoint& c) { return named_tensors(c, c.ck.adam_m); },
                             "AdamW first moments by parameter name.")
      .def_property_readonly("adam_v", [](const BoundCheckpoint& c) { return named_tensors(c, c.ck.adam_v); },
                             "AdamW second moments by parameter name.")
      .def_property_readonly("param_names", [](const BoundCheckpoint& c) {
            std::vector<std::string> n;
            for (const auto& p : c.infos) n.push_back(p.name);
            return n; }, "Parameter names in buffer order.")
      .def_property_readonly("losses", [](const BoundCheckpoint& c) {
            py::array_t<double> a({static_cast<py::ssize_t>(c.ck.losses.size())});
            if (!c.ck.losses.empty()) std::memcpy(a.mutable_data(), c.ck.losses.data(), c.ck.losses.size() * sizeof(double));
            return a; }, "Training loss of steps 1..step, float64.")
      .def_property_readonly("references", [](const BoundCheckpoint& c) {
            py::list l;
            for (const auto& r : c.ck.references)
              l.append(py::dict("linear"_a = r.linear, "role"_a = r.role, "has_value"_a = r.has_value,
                                "last_refresh"_a = r.last_refresh, "held"_a = r.held));
            return l; }, "Held tensor references (linear, role, has_value, last_refresh, held).");
  m.def("linear_kinds", []() { return fp4::linear_kinds(); },
        "linear_kinds() -> list[str]\n\nThe linear kinds recipes name (q_proj .. down_proj, in_proj, "
        "out_proj; docs/recipes.md \"Overrides\").");
  m.def("canonical_linear_kind", &fp4::canonical_linear_kind, "name"_a,
        "canonical_linear_kind(name) -> str\n\nThe kind a name stands for (a kind, or an alias such as "
        "'mlp.down'); '' if none.");
  py::class_<BoundPlan>(m, "LinearPlan", "One linear's resolved recipe (fp4::LinearPlan).")
      .def_property_readonly("mode", [](const BoundPlan& b) { return std::string(fp4::linear_mode_name(b.p.mode)); },
                             "fp32, bf16 or fp4, after [high_precision] and [[override]].")
      .def_property_readonly("specs", [](const BoundPlan& b) {
            return b.p.mode == fp4::LinearMode::FP4 ? py::object(plan_specs(b.p)) : py::object(py::none()); },
          "{gemm: {operand: spec}} of an FP4 plan (as Recipe.plan's 'specs'), else None.");
  m.def("resolve_linear_plans", &resolve_sites, "recipe"_a, "sites"_a, "n_blocks"_a,
        "resolve_linear_plans(recipe, sites, n_blocks) -> (list[LinearPlan], list[list[int]])\n\n"
        "The recipe's plan of each linear of a model of n_blocks hybrid blocks, sites being "
        "(block, kind) pairs in model order (kind: a linear kind or alias, or '' for none), and "
        "for each [[override]] the indices of the linears it changed (docs/recipes.md "
        "\"High-precision linears\", \"Overrides\"). Raises ValueError for a block outside the "
        "model or an unknown kind, fp4train.UserError for a rule that does not fit the model "
        "or an override that changes no linear.");
  py::class_<BoundLinear>(m, "Linear",
      "The C++ quantized Linear (fp4/nn/linear.h): Y = X·Wᵀ with fprop, dgrad and wgrad "
      "quantized per the recipe (SR keys, held references D, RHT, telemetry). Used by "
      "fp4train.torch.Linear; usable directly on numpy arrays.")
      .def(py::init(&make_linear), "in_features"_a, "out_features"_a, "recipe"_a, "layer"_a = 0,
           "mode"_a = "",
           "Linear(in_features, out_features, recipe, layer=0, mode='')\n\n"
           "K = in_features, N = out_features; recipe: a Recipe; layer: the layer index of the SR "
           "keys (keys (seed, step, layer, operand, gemm, micro)); mode: 'fp32', 'bf16', 'fp4' or "
           "'' for the recipe's [linear] mode. Raises ValueError for sizes < 1 or a bad mode.")
      .def(py::init(&make_linear_from_plan), "in_features"_a, "out_features"_a, "plan"_a, "layer"_a = 0,
           "Linear(in_features, out_features, plan, layer=0)\n\nThe same with a LinearPlan of "
           "resolve_linear_plans (its [high_precision] mode and [[override]] changes).")
      .def("forward", &linear_forward, "x"_a, "weight"_a, "step"_a, "seed"_a = 0, "micro"_a = 0,
           "training"_a = true, "telemetry"_a = false,
           "forward(x, weight, step, seed=0, micro=0, training=True, telemetry=False) -> y\n\n"
           "fprop: y [M, N] = quant(x [M, K]) · quant(weight [N, K])ᵀ (float32, C-contiguous) at "
           "1-based optimizer step `step` (held references refresh every D steps; SR keys). "
           "training=False: inference (no held-reference update, no backward). x and weight are "
           "copied (kept for backward). Raises ValueError for bad arrays or, in FP4 mode (whose "
           "quantizers refuse them), NaN/Inf, naming the argument and [row, col]; RuntimeError "
           "for a second training forward before the backward of the first.")
      .def("backward", &linear_backward, "dy"_a, "need_dx"_a = true,
           "backward(dy, need_dx=True) -> (dx, dw)\n\n"
           "dgrad dx [M, K] = quant(dy)·quant(W) and wgrad dw [N, K] = quant(dyᵀ)·quant(xᵀ)ᵀ of the "
           "last training forward (its step context), dy [M, N] float32; dx is None when "
           "need_dx is False. Raises RuntimeError without a pending forward, ValueError for "
           "bad arrays (RHT recipes: M must be a multiple of 16) or, in FP4 mode, a NaN/Inf in dy.")
      .def_property_readonly("in_features", [](const BoundLinear& b) { return b.K; }, "K.")
      .def_property_readonly("out_features", [](const BoundLinear& b) { return b.N; }, "N.")
      .def_property_readonly("mode", [](const BoundLinear& b) { return std::string(fp4::linear_mode_name(b.lin->mode())); }, "The Linear's mode: fp32, bf16 or fp4.")
      .def_property_readonly("refs", [](const BoundLinear& b) {
            const fp4::nn::LinearRefs& r = b.lin->refs();
            return py::dict("x"_a = r.g_x, "w"_a = r.g_w, "dy"_a = r.g_dy); },
          "The tensor references g used by the last calls (x, w, dy).")
      .def_property_readonly("telemetry", [](const BoundLinear& b) -> py::object {
            const fp4::nn::LinearTelemetry& t = b.lin->telemetry();
            if (!t.valid) return py::none();
            py::dict d;
            for (int i = 0; i < fp4::nn::LinearTelemetry::kOperands; ++i) {
              const fp4::QuantStats& q = t.op[i];
              py::dict o("saturated_blocks"_a = q.saturated_blocks, "zero_guard_blocks"_a = q.zero_guard_blocks,
                         "zeroed_nonzeros"_a = q.zeroed_nonzeros, "rel_error"_a = q.rel_error);
              if (q.has_staleness) o["staleness"] = q.staleness;
              d[fp4::nn::LinearTelemetry::kNames[i]] = o;
            }
            return d; },
          "Numerics telemetry of the last telemetry step, or None.");

  m.def("run_metrics_lines", [](const std::filesystem::path& dir) {
            const std::filesystem::path f = fp4::run_metrics_file(dir);
            fp4::MetricsReader r(f);
            std::vector<std::string> lines;
            std::string line;
            while (r.next(line)) lines.push_back(line);
            return py::make_tuple(f.string(), lines); },
        "dir"_a,
        "run_metrics_lines(dir) -> (str, list[str])\n\nThe metrics log of run directory dir as "
        "`fp4train report` reads it (fp4::run_metrics_file, fp4::MetricsReader): its path "
        "(metrics.jsonl, or metrics.jsonl.zst of a compacted run) and its lines without '\\n'. "
        "Raises fp4train.UserError naming the file when dir holds both or neither, or the zstd "
        "data is corrupt or truncated.");
  m.def("load_checkpoint", &load_checkpoint_impl, "path"_a,
        "load_checkpoint(path) -> Checkpoint\n\nA checkpoint file, or a run directory's newest "
        "checkpoint that loads (fp4::resolve_checkpoint). Tensors are split by parameter name "
        "from the model its config describes. Raises fp4train.UserError naming the file.");
}
