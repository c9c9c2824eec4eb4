// Held-out NLL under the inference reference policies, bits per byte, sampling
// (see include/fp4/eval/eval.h and docs/evaluation.md "Quantized inference evaluation").
#include "fp4/eval/eval.h"

#include <sentencepiece_processor.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <numeric>
#include <stdexcept>

#include "fp4/data/data.h"
#include "fp4/base/error.h"
#include "fp4/nn/layers.h"

namespace fp4 {
namespace {

constexpr const char* kPolicyNames =
    "none, current, replay-d<D> (e.g. replay-d50), calibrated, llama-q8_0";

nn::StepContext inference_ctx(const EvalPolicy& p) {
  nn::StepContext ctx;
  ctx.training = false;
  ctx.quantize = p.kind != EvalPolicy::Kind::None;
  switch (p.kind) {
    case EvalPolicy::Kind::None:
    case EvalPolicy::Kind::Current: ctx.infer_ref = nn::InferenceRef::Current; break;
    case EvalPolicy::Kind::Replay: ctx.infer_ref = nn::InferenceRef::Replay; break;
    case EvalPolicy::Kind::Calibrated: ctx.infer_ref = nn::InferenceRef::Frozen; break;
    case EvalPolicy::Kind::LlamaQ8: ctx.infer_ref = nn::InferenceRef::LlamaQ8; break;
  }
  return ctx;
}

void check_windows(const EvalWindows& w, int seq_len, const char* what) {
  if (!w.tokens) throw std::invalid_argument(std::string(what) + ": no token stream");
  if (w.starts.empty())
    throw UserError(std::string(what) + ": no window of seq_len + 1 = " +
                    std::to_string(seq_len + 1) + " tokens");
  for (int64_t s : w.starts)
    if (s < 0 || s + seq_len + 1 > static_cast<int64_t>(w.tokens->size()))
      throw UserError(std::string(what) + ": window at " + std::to_string(s) +
                      " runs past the end of the " + std::to_string(w.tokens->size()) +
                      "-token stream");
}

void check_shape(const nn::Model& model, int seq_len, int batch) {
  (void)model;
  if (seq_len < 1 || batch < 1)
    throw std::invalid_argument("evaluate: seq_len and batch must be >= 1");
}

// Fill inputs (and targets if non-null) [B, seq_len] from windows w0 .. w0 + B - 1.
void fill_batch(const EvalWindows& w, size_t w0, int B, int seq_len, int32_t* in, int32_t* tg) {
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < seq_len; ++t) {
      const int64_t s = w.starts[w0 + b] + t;
      in[int64_t(b) * seq_len + t] = (*w.tokens)[s];
      if (tg) tg[int64_t(b) * seq_len + t] = (*w.tokens)[s + 1];
    }
}

// Calibration pass: current scaling while each linear records the max over all calls of
// max|X| (InferenceRef::Calibrate). Returns the input tokens seen.
int64_t calibrate(nn::Model& model, const EvalWindows& calib, int seq_len, int batch) {
  check_windows(calib, seq_len, "calibration");
  nn::StepContext ctx;
  ctx.training = false;
  ctx.infer_ref = nn::InferenceRef::Calibrate;
  std::vector<int32_t> in(int64_t(batch) * seq_len);
  int64_t seen = 0;
  for (size_t w0 = 0; w0 < calib.starts.size(); w0 += batch) {
    const int B = static_cast<int>(std::min<size_t>(batch, calib.starts.size() - w0));
    fill_batch(calib, w0, B, seq_len, in.data(), nullptr);
    model.forward(in.data(), nullptr, B, ctx);
    seen += int64_t(B) * seq_len;
  }
  return seen;
}

}  // namespace

std::string EvalPolicy::name() const {
  switch (kind) {
    case Kind::None: return "none";
    case Kind::Current: return "current";
    case Kind::Replay: return "replay-d" + std::to_string(interval);
    case Kind::Calibrated: return "calibrated";
    case Kind::LlamaQ8: return "llama-q8_0";
  }
  return "?";
}

EvalPolicy parse_eval_policy(std::string_view name) {
  EvalPolicy p;
  if (name == "none") {
    p.kind = EvalPolicy::Kind::None;
  } else if (name == "current") {
    p.kind = EvalPolicy::Kind::Current;
  } else if (name == "calibrated") {
    p.kind = EvalPolicy::Kind::Calibrated;
  } else if (name == "llama-q8_0") {
    p.kind = EvalPolicy::Kind::LlamaQ8;
  } else if (name.starts_with("replay-d")) {
    const std::string_view d = name.substr(8);
    int v = 0;
    const auto [ptr, ec] = std::from_chars(d.data(), d.data() + d.size(), v);
    if (d.empty() || ec != std::errc() || ptr != d.data() + d.size() || v < 1 || v > 1000000000)
      throw UserError("policy '" + std::string(name) +
                      "': the replay interval D must be an integer in 1..1000000000 (e.g. "
                      "replay-d50)");
    p.kind = EvalPolicy::Kind::Replay;
    p.interval = v;
  } else {
    throw UserError("unknown policy '" + std::string(name) + "' (policies: " + kPolicyNames + ")");
  }
  return p;
}

std::vector<EvalPolicy> parse_eval_policies(std::string_view list) {
  std::vector<EvalPolicy> out;
  size_t pos = 0;
  while (true) {
    const size_t comma = list.find(',', pos);
    const std::string_view piece =
        list.substr(pos, comma == std::string_view::npos ? std::string_view::npos : comma - pos);
    if (piece.empty())
      throw UserError("empty policy name in '" + std::string(list) + "' (policies: " +
                      kPolicyNames + ")");
    const EvalPolicy p = parse_eval_policy(piece);
    if (std::none_of(out.begin(), out.end(), [&](const EvalPolicy& q) { return q.name() == p.name(); }))
      out.push_back(p);
    if (comma == std::string_view::npos) break;
    pos = comma + 1;
  }
  return out;
}

std::vector<EvalPolicy> default_eval_policies() {
  return parse_eval_policies("none,current,replay-d50,calibrated");
}

int piece_utf8_bytes(std::string_view piece, bool is_byte, bool is_control_or_unknown) {
  if (is_control_or_unknown) return 0;
  if (is_byte) return 1;
  static constexpr std::string_view kSpace = "\xE2\x96\x81";  // U+2581 "▁"
  int n = 0;
  for (size_t i = 0; i < piece.size();) {
    if (piece.substr(i, kSpace.size()) == kSpace) {
      n += 1;
      i += kSpace.size();
    } else {
      n += 1;
      ++i;
    }
  }
  return n;
}

std::vector<int> token_byte_lengths(const std::filesystem::path& tokenizer_model) {
  sentencepiece::SentencePieceProcessor sp;
  const auto status = sp.Load(tokenizer_model.string());
  if (!status.ok())
    throw UserError("cannot load tokenizer model '" + tokenizer_model.string() + "': " +
                    status.ToString());
  std::vector<int> len(sp.GetPieceSize());
  for (int id = 0; id < sp.GetPieceSize(); ++id)
    len[id] = piece_utf8_bytes(sp.IdToPiece(id), sp.IsByte(id),
                               sp.IsControl(id) || sp.IsUnknown(id));
  return len;
}

EvalWindows calibration_windows(const TokenStream& train_tokens, int seq_len,
                                int batch, int calib_batches) {
  if (calib_batches < 1) throw UserError("calibration batches must be >= 1");
  EvalWindows w;
  w.tokens = &train_tokens;
  w.starts = heldout_windows(static_cast<int64_t>(train_tokens.size()), seq_len,
                             calib_batches * batch);
  if (w.starts.empty())
    throw UserError("the training split has " + std::to_string(train_tokens.size()) +
                    " tokens, fewer than seq_len + 1 = " + std::to_string(seq_len + 1) +
                    ": no calibration window");
  return w;
}

std::vector<float> calibrated_activation_amax(nn::Model& model, const EvalWindows& calib,
                                              int seq_len, int batch) {
  check_shape(model, seq_len, batch);
  if (calib.starts.empty()) throw UserError("calibration needs at least one window");
  model.reset_inference();
  calibrate(model, calib, seq_len, batch);
  std::vector<float> amax(model.linears().size(), 0.0f);
  for (size_t i = 0; i < amax.size(); ++i) {
    const nn::InferenceState& st = model.linears()[i].inference_state();
    if (st.has_calibrated) amax[i] = st.calibrated_x;
  }
  model.reset_inference();
  return amax;
}

NllResult evaluate_nll(nn::Model& model, const EvalWindows& data, int seq_len, int batch,
                       const EvalPolicy& policy, const EvalWindows* calib,
                       const std::vector<int>* byte_lengths) {
  check_shape(model, seq_len, batch);
  check_windows(data, seq_len, "held-out evaluation");
  NllResult r;
  r.policy = policy.name();
  r.tokens = static_cast<int64_t>(data.starts.size()) * seq_len;
  if (byte_lengths) {
    for (int64_t s : data.starts)
      for (int t = 1; t <= seq_len; ++t) {
        const uint32_t id = (*data.tokens)[s + t];
        if (id >= byte_lengths->size())
          throw UserError("token id " + std::to_string(id) + " is outside the tokenizer's " +
                          std::to_string(byte_lengths->size()) + " pieces");
        r.bytes += (*byte_lengths)[id];
      }
  }
  model.reset_inference(policy.kind == EvalPolicy::Kind::Replay ? policy.interval : 50);
  if (policy.kind == EvalPolicy::Kind::Calibrated) {
    if (!calib || calib->starts.empty())
      throw UserError("policy calibrated needs calibration windows");
  }
  nn::StepContext ctx = inference_ctx(policy);
  std::vector<int32_t> in(int64_t(batch) * seq_len), tg(in.size());
  const int64_t V = model.config().vocab_size;
  r.window_nll.reserve(data.starts.size());
  double sum = 0;
  try {
    if (policy.kind == EvalPolicy::Kind::Calibrated)
      r.calib_tokens = calibrate(model, *calib, seq_len, batch);
    for (size_t w0 = 0; w0 < data.starts.size(); w0 += batch) {
      const int B = static_cast<int>(std::min<size_t>(batch, data.starts.size() - w0));
      fill_batch(data, w0, B, seq_len, in.data(), tg.data());
      ctx.infer_batch = ++r.batches;
      sum += model.forward(in.data(), tg.data(), B, ctx) * B;
      // Each window's mean NLL, from the logits the forward left: the same cross-entropy
      // kernel over that window's seq_len rows.
      for (int b = 0; b < B; ++b) {
        const int64_t row = int64_t(b) * seq_len;
        r.window_nll.push_back(nn::cross_entropy_forward(
            nullptr, model.logits() + row * V, tg.data() + row, seq_len, V));
      }
    }
    r.nats_per_token = sum / double(data.starts.size());
  } catch (const NonFiniteError&) {
    r.nats_per_token = std::numeric_limits<double>::quiet_NaN();
    r.window_nll.clear();
  }
  model.reset_inference();
  r.total_nats = r.nats_per_token * double(r.tokens);
  r.bits_per_byte = byte_lengths && r.bytes > 0 ? r.total_nats / std::log(2.0) / double(r.bytes)
                                                : std::numeric_limits<double>::quiet_NaN();
  return r;
}

std::vector<double> evaluate_batches_nll(
    nn::Model& model, const std::vector<std::pair<const int32_t*, const int32_t*>>& batches,
    int seq_len, int batch, const EvalPolicy& policy, const EvalWindows* calib) {
  check_shape(model, seq_len, batch);
  for (const auto& [in, tg] : batches)
    if (!in || !tg) throw std::invalid_argument("evaluate_batches_nll: null batch");
  if (policy.kind == EvalPolicy::Kind::Calibrated && (!calib || calib->starts.empty()))
    throw UserError("policy calibrated needs calibration windows");
  model.reset_inference(policy.kind == EvalPolicy::Kind::Replay ? policy.interval : 50);
  nn::StepContext ctx = inference_ctx(policy);
  std::vector<double> out;
  out.reserve(batches.size());
  try {
    if (policy.kind == EvalPolicy::Kind::Calibrated) calibrate(model, *calib, seq_len, batch);
    for (const auto& [in, tg] : batches) {
      ctx.infer_batch = int64_t(out.size()) + 1;
      out.push_back(model.forward(in, tg, batch, ctx));
    }
  } catch (const NonFiniteError&) {
    out.assign(batches.size(), std::numeric_limits<double>::quiet_NaN());
  }
  model.reset_inference();
  return out;
}

std::vector<double> continuation_logprobs(nn::Model& model, const std::vector<ScoredSequence>& seqs,
                                          int seq_len, int batch, const EvalPolicy& policy,
                                          const EvalWindows* calib) {
  check_shape(model, seq_len, batch);
  const int64_t V = model.config().vocab_size;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const auto& q = seqs[i];
    if (q.tokens.size() > size_t(seq_len) + 1 || q.continuation < 1 ||
        size_t(q.continuation) >= q.tokens.size())
      throw std::invalid_argument("continuation_logprobs: sequence " + std::to_string(i) + " has " +
                                  std::to_string(q.tokens.size()) + " tokens and a continuation of " +
                                  std::to_string(q.continuation) + " (seq_len " +
                                  std::to_string(seq_len) + ")");
    for (int32_t id : q.tokens)
      if (id < 0 || id >= V)
        throw UserError("continuation_logprobs: token id " + std::to_string(id) +
                        " outside the vocabulary of " + std::to_string(V));
  }
  model.reset_inference(policy.kind == EvalPolicy::Kind::Replay ? policy.interval : 50);
  if (policy.kind == EvalPolicy::Kind::Calibrated && (!calib || calib->starts.empty()))
    throw UserError("policy calibrated needs calibration windows");
  nn::StepContext ctx = inference_ctx(policy);
  std::vector<int32_t> in(int64_t(batch) * seq_len), tg(in.size());
  std::vector<double> out;
  out.reserve(seqs.size());
  try {
    // Calibration windows are the model's length, whatever the rows' forward length.
    if (policy.kind == EvalPolicy::Kind::Calibrated)
      calibrate(model, *calib, model.max_seq_len(), batch);
    int64_t batches = 0;
    for (size_t s0 = 0; s0 < seqs.size(); s0 += size_t(batch)) {
      const int B = static_cast<int>(std::min<size_t>(size_t(batch), seqs.size() - s0));
      std::fill(in.begin(), in.end(), kTokenEos);
      std::fill(tg.begin(), tg.end(), kTokenEos);
      for (int b = 0; b < B; ++b) {
        const auto& t = seqs[s0 + size_t(b)].tokens;
        for (size_t j = 0; j + 1 < t.size(); ++j) {
          in[size_t(b) * size_t(seq_len) + j] = t[j];
          tg[size_t(b) * size_t(seq_len) + j] = t[j + 1];
        }
      }
      ctx.infer_batch = ++batches;
      model.forward(in.data(), tg.data(), B, ctx, seq_len);
      for (int b = 0; b < B; ++b) {
        const auto& q = seqs[s0 + size_t(b)];
        const int64_t first = int64_t(q.tokens.size()) - 1 - q.continuation;  // target index
        const int64_t row = int64_t(b) * seq_len + first;
        out.push_back(-nn::cross_entropy_forward(nullptr, model.logits() + row * V,
                                                 tg.data() + row, q.continuation, V) *
                      q.continuation);
      }
    }
  } catch (const NonFiniteError&) {
    out.assign(seqs.size(), std::numeric_limits<double>::quiet_NaN());
  }
  model.reset_inference();
  return out;
}

std::vector<double> nll_batch_sums(nn::Model& model, const EvalWindows& data, int seq_len,
                                   int batch, const EvalPolicy& policy, int part, int parts) {
  check_shape(model, seq_len, batch);
  check_windows(data, seq_len, "held-out evaluation");
  if (policy.kind != EvalPolicy::Kind::None && policy.kind != EvalPolicy::Kind::Current)
    throw std::invalid_argument("nll_batch_sums: policy " + policy.name() +
                                " carries state across batches (none and current only)");
  if (parts < 1 || part < 0 || part >= parts)
    throw std::invalid_argument("nll_batch_sums: part " + std::to_string(part) + " of " +
                                std::to_string(parts));
  model.reset_inference(50);
  nn::StepContext ctx = inference_ctx(policy);
  std::vector<int32_t> in(int64_t(batch) * seq_len), tg(in.size());
  std::vector<double> sums;
  const size_t nb = (data.starts.size() + size_t(batch) - 1) / size_t(batch);
  try {
    for (size_t b = size_t(part); b < nb; b += size_t(parts)) {
      const size_t w0 = b * size_t(batch);
      const int B = static_cast<int>(std::min<size_t>(batch, data.starts.size() - w0));
      fill_batch(data, w0, B, seq_len, in.data(), tg.data());
      ctx.infer_batch = int64_t(b) + 1;
      sums.push_back(model.forward(in.data(), tg.data(), B, ctx) * B);
    }
  } catch (const NonFiniteError&) {
    sums.assign((nb - size_t(part) + size_t(parts) - 1) / size_t(parts),
                std::numeric_limits<double>::quiet_NaN());
  }
  model.reset_inference();
  return sums;
}

std::vector<int> sample_tokens(nn::Model& model, const std::vector<int>& prompt,
                               const SampleOptions& opt, int seq_len, int batch,
                               const EvalWindows* calib) {
  const int V = model.config().vocab_size;
  if (prompt.empty()) throw std::invalid_argument("sample_tokens: empty prompt");
  for (int id : prompt)
    if (id < 0 || id >= V)
      throw std::invalid_argument("sample_tokens: prompt id " + std::to_string(id) +
                                  " outside the vocabulary of " + std::to_string(V));
  if (opt.temperature < 0 || !std::isfinite(opt.temperature))
    throw UserError("temperature must be a finite number >= 0");
  if (opt.top_k < 0) throw UserError("top-k must be >= 0");
  model.reset_inference(opt.policy.kind == EvalPolicy::Kind::Replay ? opt.policy.interval : 50);
  if (opt.policy.kind == EvalPolicy::Kind::Calibrated) {
    if (!calib) throw UserError("policy calibrated needs calibration windows");
    calibrate(model, *calib, seq_len, batch);
  }
  nn::StepContext ctx = inference_ctx(opt.policy);
  std::vector<int> seq = prompt, out;
  std::vector<int32_t> window;
  std::vector<int> order(V);
  std::vector<double> p;
  for (int t = 0; t < opt.max_new_tokens; ++t) {
    const int n = static_cast<int>(std::min<size_t>(seq.size(), size_t(seq_len)));
    window.assign(seq.end() - n, seq.end());
    ctx.infer_batch = t + 1;
    model.forward(window.data(), nullptr, 1, ctx, n);
    const float* logits = model.logits() + int64_t(n - 1) * V;
    std::iota(order.begin(), order.end(), 0);
    int next;
    if (opt.temperature == 0) {
      next = static_cast<int>(std::max_element(logits, logits + V) - logits);  // first max
    } else {
      const int k = opt.top_k > 0 ? std::min(opt.top_k, V) : V;
      std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int a, int b) {
        return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
      });
      p.assign(k, 0.0);
      const double mx = logits[order[0]];
      double z = 0;
      for (int i = 0; i < k; ++i) z += p[i] = std::exp((logits[order[i]] - mx) / opt.temperature);
      const double u = double(splitmix64(opt.seed, uint64_t(t)) >> 11) * 0x1.0p-53 * z;
      double c = 0;
      next = order[k - 1];
      for (int i = 0; i < k; ++i) {
        c += p[i];
        if (u < c) {
          next = order[i];
          break;
        }
      }
    }
    out.push_back(next);
    seq.push_back(next);
    if (opt.stop_at_eos && next == kTokenEos) break;
  }
  model.reset_inference();
  return out;
}

}  // namespace fp4
