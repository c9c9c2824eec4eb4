// `fp4train quant [FILE]`: quantize a small matrix read as text and print every step of
// docs/numerics.md "Quantizing one operand" as JSON (tensor scales, block scales, element codes,
// dequantized values). Meant for inspecting and cross-checking the numerics by hand.
// Element formats, scale formats and scale rules are chosen by name (docs/formats.md).
#include <cctype>
#include <cfloat>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <iostream>
#include <map>
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
#include "fp4/numerics/pack_fast.h"
#include "fp4/numerics/philox.h"
#include "fp4/numerics/qtensor.h"
#include "fp4/numerics/quant_fast.h"

namespace fp4::cli {

namespace {

struct QuantOptions {
  std::string file = "-";
  std::string scale_format = "ue5m3";
  std::string element_format = "e2m1";
  std::string scale_rule = "tensor-scaled";
  std::string four_over_six = "off";  ///< --four-over-six (docs/numerics.md "Four Over Six")
  int block = 16;
  bool two_d = false;
  float target = 448.f;
  double reference = -1.0;  // < 0 in the default: "not given" is tracked by the Option*
  std::string rounding = "rne";
  uint64_t seed = 0;
  std::string save;  ///< --save: packed QTensor safetensors file ("" = none)
  bool row_scaled = false;  ///< --row-scaled: one current reference per row (row_amax)
};

// The quantization spec of the options. Throws fp4::UserError naming the option that is
// malformed, out of range or does not fit the others.
BlockQuantSpec quant_spec(const QuantOptions& o, bool reference_given) {
  BlockQuantSpec spec;
  try {
    set_scale_format(spec, o.scale_format);
  } catch (const std::invalid_argument& e) {
    throw UserError(std::string("--scale-format: ") + e.what());
  }
  try {
    spec.element = parse_element_format(o.element_format);
  } catch (const std::invalid_argument& e) {
    throw UserError(std::string("--element-format: ") + e.what());
  }
  try {
    spec.scale_rule = parse_scale_rule(o.scale_rule);
  } catch (const std::invalid_argument& e) {
    throw UserError(std::string("--scale-rule: ") + e.what());
  }
  if (spec.scale_rule != ScaleRule::TensorScaled && spec_scale_format(spec).frac_bits != 0) {
    throw UserError(std::string("--scale-rule ") + scale_rule_name(spec.scale_rule) +
                    " needs a power-of-two scale format: add --scale-format ue8m0 (got " +
                    spec_scale_format(spec).name + ")");
  }
  try {
    spec.four_over_six = parse_four_over_six(o.four_over_six);
  } catch (const std::invalid_argument& e) {
    throw UserError(std::string("--four-over-six: ") + e.what());
  }
  if (spec.four_over_six != FourOverSix::Off && spec.scale_rule != ScaleRule::TensorScaled)
    throw UserError(std::string("--four-over-six ") + o.four_over_six + " needs a tensor scale: "
                    "leave --scale-rule at tensor-scaled (got " + scale_rule_name(spec.scale_rule) + ")");
  if (const std::string e = block_length_error(o.block); !e.empty())
    throw UserError("--block " + e);
  spec.block = o.block;
  spec.two_d = o.two_d;
  if (!(o.target > 0.f) || std::isinf(o.target)) {
    throw UserError("--target must be finite and > 0, got " + num(o.target));
  }
  spec.target = o.target;
  spec.rounding = parse_rounding(o.rounding);
  if (o.row_scaled && (reference_given || o.two_d || !o.save.empty() ||
                       spec.scale_rule != ScaleRule::TensorScaled)) {
    throw UserError(std::string("--row-scaled takes each row's current amax as its reference "
                                "(docs/numerics.md \"Per-row reference\"): it excludes ") +
                    (reference_given ? "--reference" : o.two_d ? "--2d (a tile spans rows)"
                     : !o.save.empty() ? "--save (a packed QTensor has one tensor scale)"
                                       : "the mx scale rules (no tensor scale)"));
  }
  if (reference_given &&
      (!(o.reference >= 0.0) || std::isinf(o.reference) || o.reference > FLT_MAX)) {
    throw UserError("--reference must be finite and >= 0, got " + num(o.reference));
  }
  return spec;
}

// The input matrix: stdin for "-", else the file. Throws fp4::UserError (unreadable file,
// malformed text: matrix_text.h).
Matrix read_input(const std::string& file) {
  if (file == "-") return read_matrix(std::cin, "<stdin>");
  std::ifstream f(file);
  if (!f) throw UserError("cannot open input file '" + file + "'");
  return read_matrix(f, file);
}

// The SR key of the command: seed `seed`, step 1, layer 0, operand 2 (dY), GEMM 0.
SrKey quant_key(uint64_t seed) {
  SrKey key;
  key.seed = seed;
  key.step = 1;
  key.layer = 0;
  key.operand = 2;
  key.gemm = 0;
  return key;
}

// --save: the packed QTensor of m, from quantize_pack_fast (the fused SIMD quantizer; MXFP4
// through the scalar composition), bit-identical to packing the scalar quantization.
void save_packed(const QuantOptions& o, const BlockQuantSpec& spec, const Matrix& m, float g,
                 const SrKey& key) {
  BlockQuantSpec packable = spec;  // 4/6 changes the scales, not what a QTensor holds
  packable.four_over_six = FourOverSix::Off;
  if (!quant_fast_supports(packable)) {
    throw UserError(
        "--save: packed QTensor files hold e2m1 elements with tensor-scaled ue5m3, "
        "ue5m3-ptx, e4m3 or ue8m0 block scales, or MXFP4 (ue8m0 under mx-te or "
        "mx-ocp); got element " +
        spec.element.name() + ", scale " + spec_scale_format(spec).name + ", rule " +
        scale_rule_name(spec.scale_rule));
  }
  std::map<std::string, std::string> facts = {{"source", "fp4train quant"},
                                              {"rounding", o.rounding}};
  if (spec.rounding == Rounding::SR8) facts["seed"] = std::to_string(o.seed);
  if (spec.four_over_six != FourOverSix::Off) facts["four_over_six"] = o.four_over_six;
  save_safetensors(quantize_pack_fast(m.data.data(), m.rows, m.cols, spec, g, &key, facts), o.save);
}

// The "spec" object of the output: the quantization as applied (and the SR key under sr8).
nlohmann::ordered_json spec_json(const QuantOptions& o, const BlockQuantSpec& spec,
                                 const SrKey& key) {
  nlohmann::ordered_json js;
  js["element_format"] = spec.element.name();
  js["scale_format"] = spec_scale_format(spec).name;
  js["scale_rule"] = scale_rule_name(spec.scale_rule);
  js["block"] = spec.block;
  js["two_d"] = spec.two_d;
  js["target"] = spec.target;
  js["rounding"] = o.rounding;
  if (spec.four_over_six != FourOverSix::Off) js["four_over_six"] = o.four_over_six;
  if (spec.rounding == Rounding::SR8) {
    js["seed"] = o.seed;
    js["sr_key"] = {
        {"step", key.step}, {"layer", key.layer}, {"operand", key.operand}, {"gemm", key.gemm}};
  }
  return js;
}

// The "blocks" array: per block (block-grid order) its indices, element origin, amax, scale
// code, scale and decode scale.
nlohmann::ordered_json blocks_json(const QuantizedTensor& q, const BlockQuantSpec& spec) {
  nlohmann::ordered_json blocks = nlohmann::ordered_json::array();
  for (int64_t br = 0; br < q.block_rows; ++br) {
    for (int64_t bc = 0; bc < q.block_cols; ++bc) {
      const size_t b = static_cast<size_t>(br * q.block_cols + bc);
      nlohmann::ordered_json jb;
      jb["row"] = br;  // block-grid indices; element origin below
      jb["col"] = bc;
      jb["first_row"] = spec.two_d ? br * spec.block : br;
      jb["first_col"] = bc * spec.block;
      jb["amax"] = q.block_amax[b];
      jb["scale_code"] = q.scale_codes[b];
      jb["scale"] = q.scales[b];
      jb["decode_scale"] = q.scales[b] * (q.row_gd.empty() ? q.gd : q.row_gd[static_cast<size_t>(br)]);
      blocks.push_back(jb);
    }
  }
  return blocks;
}

// The "elements" array: per row, the element codes and their dequantized values.
nlohmann::ordered_json elements_json(const QuantizedTensor& q, const Matrix& m,
                                     const std::vector<float>& deq) {
  nlohmann::ordered_json elems = nlohmann::ordered_json::array();
  for (int64_t r = 0; r < m.rows; ++r) {
    nlohmann::ordered_json codes = nlohmann::ordered_json::array();
    nlohmann::ordered_json values = nlohmann::ordered_json::array();
    for (int64_t c = 0; c < m.cols; ++c) {
      codes.push_back(q.codes[static_cast<size_t>(r * m.cols + c)]);
      values.push_back(deq[static_cast<size_t>(r * m.cols + c)]);
    }
    elems.push_back({{"codes", codes}, {"values", values}});
  }
  return elems;
}

void run_quant(const QuantOptions& o, bool reference_given) {
  const BlockQuantSpec spec = quant_spec(o, reference_given);
  const Matrix m = read_input(o.file);
  const float g = reference_given ? static_cast<float>(o.reference)
                                  : tensor_amax(m.data.data(), static_cast<int64_t>(m.data.size()));
  const SrKey key = quant_key(o.seed);
  QuantizedTensor q;
  std::vector<float> deq(m.data.size());
  try {
    if (o.row_scaled) {
      std::vector<float> row_g(static_cast<size_t>(m.rows));
      row_amax(m.data.data(), m.rows, m.cols, row_g.data());
      q = quantize_blocks_rows(m.data.data(), m.rows, m.cols, spec, row_g.data(), &key);
    } else {
      q = quantize_blocks(m.data.data(), m.rows, m.cols, spec, g, &key);
    }
    dequantize(q, deq.data());
    // mx-te near FLT_MAX: an error, not a JSON null (docs/formats.md "`mx-te` and `mx-ocp`
    // (MXFP4)", "Edge: overflow near FLT_MAX").
    check_dequantized_finite("quant", q, m.data.data(), deq.data());
  } catch (const std::invalid_argument& e) {
    throw UserError(e.what());
  }
  if (!o.save.empty()) save_packed(o, spec, m, g, key);

  nlohmann::ordered_json out;
  out["rows"] = m.rows;
  out["cols"] = m.cols;
  out["spec"] = spec_json(o, spec, key);
  out["g"] = q.g;
  out["reference_given"] = reference_given;
  out["ge"] = q.ge;
  out["gd"] = q.gd;
  if (o.row_scaled) {  // the per-row references and scales (g, ge, gd above are unused)
    out["row_scaled"] = true;
    out["row_g"] = q.row_g;
    out["row_ge"] = q.row_ge;
    out["row_gd"] = q.row_gd;
  }
  out["block_rows"] = q.block_rows;
  out["block_cols"] = q.block_cols;
  out["blocks"] = blocks_json(q, spec);
  out["elements"] = elements_json(q, m, deq);
  if (!o.save.empty()) out["saved"] = o.save;
  std::cout << out.dump(2) << "\n";
}

}  // namespace

void register_quant(CLI::App& app) {
  auto opts = std::make_shared<QuantOptions>();
  CLI::App* sub = app.add_subcommand(
      "quant",
      "Quantize a matrix (text: one row per line, whitespace-separated numbers) with block-scaled\n"
      "FP4 and print tensor scales, block scales, element codes and dequantized values as JSON.\n"
      "Block \"row\"/\"col\" are block-grid indices. Contract: docs/numerics.md \"Quantizing one "
      "operand\".");
  sub->add_option("file", opts->file, "Input file ('-' or omitted: stdin)");
  sub->add_option("--scale-format", opts->scale_format,
                  "Block-scale format: ue5m3, ue5m3-ptx, e4m3, ue8m0, ue4m3, or a spelled "
                  "ue<E>m<M> (docs/formats.md)")
      ->capture_default_str();
  sub->add_option("--element-format", opts->element_format,
                  "Element format: e2m1, e1m2, e3m0, e2m3, e3m2, e4m3, e5m2, a spelled e<E>m<M>, "
                  "int4, int4-sym (docs/formats.md)")
      ->capture_default_str();
  sub->add_option("--scale-rule", opts->scale_rule,
                  "Block-scale rule: tensor-scaled (T, g), mx-te (2^ceil(log2(amax/emax)), no "
                  "tensor scale) or mx-ocp (2^(floor(log2 amax) - emax_exp), saturating); the "
                  "mx rules need --scale-format ue8m0")
      ->capture_default_str();
  sub->add_option("--four-over-six", opts->four_over_six,
                  "Four Over Six block scales (a recipe's fp4.four_over_six_error): off, mae, "
                  "mse; each block keeps the lower-error of its amax mapped to 6 and to 4 "
                  "(docs/numerics.md \"Four Over Six\")")
      ->capture_default_str();
  sub->add_option("--block", opts->block,
                  "Block length along the last dim (a recipe's fp4.block); with --2d the tile "
                  "side (a recipe's fp4.weight_block, which may differ from fp4.block)")
      ->capture_default_str();
  sub->add_flag("--2d", opts->two_d,
                "block x block tiles (weights: --block 32 --2d are a recipe's 32 x 32 weight "
                "tiles) instead of 1 x block");
  sub->add_option("--target", opts->target, "Scale target T")->capture_default_str();
  sub->add_flag("--row-scaled", opts->row_scaled,
                "One tensor reference per row, its current max|x| (a recipe's "
                "fp4.row_scaled_activation); prints row_g, row_ge, row_gd");
  CLI::Option* ref =
      sub->add_option("--reference", opts->reference,
                      "Tensor reference amax g (default: current max|x| of the input)");
  sub->add_option("--rounding", opts->rounding, "Element rounding: rne, sr8, rna (ties away)")
      ->capture_default_str();
  sub->add_option("--seed", opts->seed,
                  "SR key seed (key: step 1, layer 0, operand 2 = dY, gemm 0)")
      ->capture_default_str()
      ->check(CLI::Validator(
          [](std::string& v) {
            return v.rfind('-', 0) == 0 ? std::string("must be >= 0") : std::string();
          },
          "NONNEGATIVE"));
  sub->add_option(
      "--save", opts->save,
      "Also write the packed QTensor (two E2M1 codes per byte + one scale byte per "
      "block, safetensors as fp4/numerics/qtensor.h describes; MXFP4 too) to this file");
  sub->callback([opts, ref]() { run_quant(*opts, ref->count() > 0); });
}

}  // namespace fp4::cli
