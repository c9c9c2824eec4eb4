// `fp4train gemm A.txt B.txt`: quantize two matrices read as text along their shared K
// dimension and print the emulated FP4 product C = A·Bᵀ (probe-matched, decoded or decoded-bf16 mode,
// docs/numerics.md "GEMM emulation"), so users can compare it with their own hardware's output.
#include <cctype>
#include <cfloat>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "commands.h"
#include "matrix_text.h"
#include "fp4/numerics/block_quant.h"
#include "fp4/base/error.h"
#include "fp4/numerics/format.h"
#include "fp4/numerics/philox.h"
#include "fp4/gemm/probe_gemm.h"

namespace fp4::cli {

namespace {

/// Options of one operand; empty strings / *_given == false mean "use the common option".
struct OperandOptions {
  std::string scale_format;
  int block = 0;
  bool block_given = false;
  bool two_d = false;
  float target = 0.f;
  bool target_given = false;
  double reference = -1.0;
  bool reference_given = false;
  std::string rounding;
};

struct GemmOptions {
  std::string file_a, file_b;
  std::string scale_format = "ue5m3";
  std::string scale_rule = "tensor-scaled";
  int block = 16;
  float target = 448.f;
  std::string rounding = "rne";
  uint64_t seed = 0;
  std::string mode = "probe-matched";
  int chunk = kProbeChunk;             ///< --chunk: products per chunk of the probe-matched mode
  std::string accumulate = "rtz";      ///< --accumulate: rtz | rne additions of the partials
  int snap = 1 << kProbeSnapBits;      ///< --snap: grid 1/d, 0 = none
  bool json = false;
  OperandOptions a, b;
};

/// Rows of numbers, one row per line, whitespace separated; blank lines are skipped.
Matrix read_matrix_file(const std::string& path, const std::string& role) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    throw UserError(role + " file '" + path + "' is a directory, not a text file");
  }
  std::ifstream in(path);
  if (!in) throw UserError("cannot open " + role + " file '" + path + "'");
  return fp4::cli::read_matrix(in, path, role + " file");
}

/// The quantization of one operand: the common options overridden by the operand's own.
struct OperandSetup {
  BlockQuantSpec spec;
  std::string rounding;
  bool reference_given = false;
  float reference = 0.f;
};

OperandSetup resolve(const GemmOptions& o, const OperandOptions& p, char which) {
  const bool reference_given = p.reference_given;
  const std::string pre = std::string("--") + which + "-";
  OperandSetup s;
  const std::string sf = p.scale_format.empty() ? o.scale_format : p.scale_format;
  const std::string sf_opt = p.scale_format.empty() ? "--scale-format" : pre + "scale-format";
  try {
    set_scale_format(s.spec, sf);
  } catch (const std::invalid_argument& e) {
    throw UserError(sf_opt + ": " + e.what());
  }
  try {
    s.spec.scale_rule = parse_scale_rule(o.scale_rule);
  } catch (const std::invalid_argument& e) {
    throw UserError(std::string("--scale-rule: ") + e.what());
  }
  if (s.spec.scale_rule != ScaleRule::TensorScaled && spec_scale_format(s.spec).frac_bits != 0) {
    throw UserError(std::string("--scale-rule ") + scale_rule_name(s.spec.scale_rule) +
                    " needs a power-of-two scale format: use ue8m0 for operand " + which +
                    " (got " + spec_scale_format(s.spec).name + ")");
  }
  const int block = p.block_given ? p.block : o.block;
  if (const std::string e = block_length_error(block); !e.empty())
    throw UserError((p.block_given ? pre + "block" : std::string("--block")) + " " + e);
  s.spec.block = block;
  s.spec.two_d = p.two_d;
  const float target = p.target_given ? p.target : o.target;
  if (!(target > 0.f) || std::isinf(target)) {
    throw UserError((p.target_given ? pre + "target" : std::string("--target")) +
                    " must be finite and > 0, got " + num(target));
  }
  s.spec.target = target;
  s.rounding = p.rounding.empty() ? o.rounding : p.rounding;
  s.spec.rounding = parse_rounding(s.rounding, p.rounding.empty() ? "--rounding" : pre + "rounding");
  s.reference_given = reference_given;
  if (reference_given) {
    if (!(p.reference >= 0.0) || std::isinf(p.reference) || p.reference > FLT_MAX) {
      throw UserError(std::string("--reference-") + which + " must be finite and >= 0, got " +
                      num(p.reference));
    }
    s.reference = static_cast<float>(p.reference);
  }
  return s;
}

QuantizedTensor quantize_operand(const Matrix& m, const OperandSetup& s, uint64_t seed,
                                 uint32_t operand) {
  const float g = s.reference_given
                      ? s.reference
                      : tensor_amax(m.data.data(), static_cast<int64_t>(m.data.size()));
  SrKey key;
  key.seed = seed;
  key.step = 1;
  key.layer = 0;
  key.operand = operand;
  key.gemm = 0;
  try {
    return quantize_blocks(m.data.data(), m.rows, m.cols, s.spec, g, &key);
  } catch (const std::invalid_argument& e) {
    throw UserError(e.what());
  }
}

nlohmann::ordered_json operand_json(const QuantizedTensor& q, const OperandSetup& s,
                                    const std::string& file) {
  nlohmann::ordered_json j;
  j["file"] = file;
  j["rows"] = q.rows;
  j["cols"] = q.cols;
  j["scale_format"] = spec_scale_format(s.spec).name;
  j["scale_rule"] = scale_rule_name(s.spec.scale_rule);
  j["block"] = s.spec.block;
  j["two_d"] = s.spec.two_d;
  j["target"] = s.spec.target;
  j["rounding"] = s.rounding;
  j["g"] = q.g;
  j["reference_given"] = s.reference_given;
  j["ge"] = q.ge;
  j["gd"] = q.gd;
  return j;
}

void run_gemm(const GemmOptions& o) {
  GemmMode mode;
  try {
    mode = parse_gemm_mode(o.mode);
  } catch (const std::invalid_argument& e) {
    throw UserError(std::string("--mode: ") + e.what());
  }
  Accumulator acc;
  acc.chunk = o.chunk;
  acc.snap = o.snap;
  try {
    acc.rounding = parse_accum_rounding(o.accumulate, "--accumulate");
  } catch (const std::invalid_argument& e) {
    throw UserError(e.what());
  }
  try {
    acc.check();
  } catch (const std::invalid_argument& e) {  // "accumulator chunk: ..." → "--chunk: ..."
    throw UserError(std::string(e.what()).replace(0, std::string("accumulator ").size(), "--"));
  }
  if (mode != GemmMode::ProbeMatched && !acc.is_default())
    throw UserError("--chunk, --accumulate and --snap describe the probe-matched GEMM's "
                    "accumulator; the decoded modes run no such accumulator (use --mode probe-matched)");
  const OperandSetup sa = resolve(o, o.a, 'a');
  const OperandSetup sb = resolve(o, o.b, 'b');
  const Matrix A = read_matrix_file(o.file_a, "A");
  const Matrix B = read_matrix_file(o.file_b, "B");
  if (A.cols != B.cols) {
    throw UserError("K mismatch: A (" + o.file_a + ") is " + std::to_string(A.rows) + "x" +
                    std::to_string(A.cols) + " and B (" + o.file_b + ") is " +
                    std::to_string(B.rows) + "x" + std::to_string(B.cols) +
                    "; C = A·Bᵀ needs the same number of columns K in both (B is [N, K], not "
                    "[K, N])");
  }
  // SR keys: operand 0 = A, 1 = B (only used with --rounding sr8).
  const QuantizedTensor qa = quantize_operand(A, sa, o.seed, 0);
  const QuantizedTensor qb = quantize_operand(B, sb, o.seed, 1);
  std::vector<float> C(static_cast<size_t>(A.rows * B.rows));
  try {
    if (mode == GemmMode::ProbeMatched) {
      ProbeGemmOptions po;
      po.accumulator = acc;
      probe_gemm(qa, qb, C.data(), po);
    } else {
      quantized_gemm(mode, qa, qb, C.data());
    }
  } catch (const std::invalid_argument& e) {
    throw UserError(std::string("gemm: ") + e.what());
  }

  if (o.json) {
    nlohmann::ordered_json out;
    out["mode"] = gemm_mode_name(mode);
    out["M"] = A.rows;
    out["N"] = B.rows;
    out["K"] = A.cols;
    if (mode == GemmMode::ProbeMatched) {
      out["chunk"] = acc.chunk;
      out["accumulate"] = accum_rounding_name(acc.rounding);
      out["snap"] = acc.snap == 0 ? 0.0 : 1.0 / acc.snap;  // the grid spacing; 0 = no snap
      out["alpha"] = probe_gemm_alpha(qa, qb);
    }
    out["a"] = operand_json(qa, sa, o.file_a);
    out["b"] = operand_json(qb, sb, o.file_b);
    nlohmann::ordered_json rows = nlohmann::ordered_json::array();
    for (int64_t i = 0; i < A.rows; ++i) {
      nlohmann::ordered_json row = nlohmann::ordered_json::array();
      for (int64_t j = 0; j < B.rows; ++j) row.push_back(C[static_cast<size_t>(i * B.rows + j)]);
      rows.push_back(row);
    }
    out["c"] = rows;
    std::cout << out.dump(2) << "\n";
    return;
  }
  std::string line;
  char buf[64];
  for (int64_t i = 0; i < A.rows; ++i) {
    line.clear();
    for (int64_t j = 0; j < B.rows; ++j) {
      std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(C[static_cast<size_t>(i * B.rows + j)]));
      if (j) line += ' ';
      line += buf;
    }
    std::cout << line << '\n';
  }
}

}  // namespace

void register_gemm(CLI::App& app) {
  auto o = std::make_shared<GemmOptions>();
  CLI::App* sub = app.add_subcommand(
      "gemm",
      "Quantize two matrices along their shared K dimension and print the emulated FP4 product\n"
      "C = A·Bᵀ. Files are text, one row per line, whitespace-separated numbers; A is [M, K] and\n"
      "B is [N, K] (each row of B is one output column, as the weight of a linear layer), so\n"
      "C is [M, N], printed one row per line (%.9g) or as JSON with --json.\n"
      "Modes (docs/numerics.md \"GEMM emulation\", docs/gemm.md): probe-matched (default here) models\n"
      "the native FP4 GEMM: products q·c_b, exact 64-long chunk sums rounded once to FP32,\n"
      "round-toward-zero accumulation, 1/1024 snap (--chunk, --accumulate, --snap change\n"
      "these three: the accumulator, fp4/gemm/accumulator.h), then times\n"
      "α = fl(fl(g_a·g_b) / fl(fl(T_a·6)·fl(T_b·6))) in FP32, from each operand's tensor\n"
      "reference g and scale target T (not fl(gd_a·gd_b), which can differ in the last bit; an\n"
      "operand without a tensor scale, as under the MX rules, enters with g = T·6 = 1);\n"
      "decoded dequantizes both operands to FP32 and runs an FP32 GEMM; decoded-bf16 multiplies\n"
      "the operands q·c_b on the BF16 GEMM and applies the two tensor decode scales to the\n"
      "output (docs/gemm.md \"Decoded FP4 on the BF16 GEMM\"). Each --X option\n"
      "applies to both operands unless its --a-X / --b-X form overrides it for one.");
  sub->add_option("A", o->file_a, "Matrix A [M, K] (text file)")->required();
  sub->add_option("B", o->file_b, "Matrix B [N, K] (text file); C = A·Bᵀ")->required();
  sub->add_option("--mode", o->mode, "GEMM emulation: probe-matched, decoded or decoded-bf16")->capture_default_str();
  sub->add_option("--chunk", o->chunk,
                  "Probe-matched accumulator: products per chunk, each chunk's exact sum rounded "
                  "once to FP32 (16, 32, 64 or 128)")
      ->capture_default_str();
  sub->add_option("--accumulate", o->accumulate,
                  "Probe-matched accumulator: rounding of the FP32 additions of the chunk sums, "
                  "rtz (round toward zero, the paper's probe) or rne")
      ->capture_default_str();
  sub->add_option("--snap", o->snap,
                  "Probe-matched accumulator: snap the sum to the grid 1/d (RNE) before α; "
                  "0 = no snap, else a power of two up to 65536")
      ->capture_default_str();
  sub->add_flag("--json", o->json, "Print JSON (mode, shapes, α, both operands' tensor scales, C)");
  sub->add_option("--scale-format", o->scale_format,
                  "Block-scale format: ue5m3, ue5m3-ptx, e4m3, ue8m0 (or ue4m3, a spelled ue<E>m<M>)")
      ->capture_default_str();
  sub->add_option("--scale-rule", o->scale_rule,
                  "Block-scale rule: tensor-scaled, mx-te or mx-ocp (mx rules need ue8m0)")
      ->capture_default_str();
  sub->add_option("--block", o->block, "Block length along K (tile side with --a-2d/--b-2d)")
      ->capture_default_str();
  sub->add_option("--target", o->target, "Scale target T")->capture_default_str();
  sub->add_option("--rounding", o->rounding, "Element rounding: rne, sr8 or rna")->capture_default_str();
  sub->add_option("--seed", o->seed, "SR key seed (key: step 1, layer 0, operand 0 = A / 1 = B)")
      ->capture_default_str()
      ->check(CLI::Validator(
          [](std::string& v) { return v.rfind('-', 0) == 0 ? std::string("must be >= 0") : std::string(); },
          "NONNEGATIVE"));
  std::vector<CLI::Option*> given;  // per operand: block, target, reference
  for (char w : {'a', 'b'}) {
    OperandOptions& p = w == 'a' ? o->a : o->b;
    const std::string pre = std::string("--") + w + "-";
    const std::string op = w == 'a' ? "A" : "B";
    sub->add_option(pre + "scale-format", p.scale_format, "Block-scale format of " + op);
    given.push_back(sub->add_option(pre + "block", p.block, "Block length of " + op));
    sub->add_flag(pre + "2d", p.two_d,
                  "Quantize " + op + " in block x block tiles (weights) instead of 1 x block");
    given.push_back(sub->add_option(pre + "target", p.target, "Scale target T of " + op));
    sub->add_option(pre + "rounding", p.rounding, "Element rounding of " + op + ": rne, sr8 or rna");
    given.push_back(sub->add_option(std::string("--reference-") + w, p.reference,
                                    "Tensor reference amax g of " + op + " (default: max|" + op +
                                        "|)"));
  }
  sub->callback([o, given]() {
    o->a.block_given = given[0]->count() > 0;
    o->a.target_given = given[1]->count() > 0;
    o->a.reference_given = given[2]->count() > 0;
    o->b.block_given = given[3]->count() > 0;
    o->b.target_given = given[4]->count() > 0;
    o->b.reference_given = given[5]->count() > 0;
    run_gemm(*o);
  });
}

}  // namespace fp4::cli
