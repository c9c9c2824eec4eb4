// Held-out NLL under quantized inference: the four inference reference policies of
// docs/evaluation.md "Quantized inference evaluation" (docs/numerics.md "Tensor reference g"),
// nats per token and bits per byte.
//
// With every policy except `none`, the recipe's forward quantization (fprop X and W of every
// FP4 linear, BF16 rounding of BF16 linears) is applied; the LM head, embeddings, norms and
// attention products stay FP32 as in training. Weights' amax is measured at the first
// forward of an evaluation and frozen. The activation reference g of each (linear, X) is:
//   none        no quantization at all (FP32 inference);
//   current     max|X| of the tensor of each call (D = 1);
//   replay-dD   cold periodic sample-and-hold over the ORDERED evaluation batches: empty at
//               the start of the evaluation, refreshed to max|X| at evaluation batch 1, D+1,
//               2D+1, ... and held in between (D = 50 by default);
//   calibrated  max over `calib_batches` calibration batches of max|X|, measured with
//               current scaling on windows disjoint from the evaluated ones (by default the
//               first windows of the training split), then frozen for the whole evaluation.
// Evaluation never reads or writes the training held-amax caches (Linear::reference), so a
// training step after an evaluation is bit-identical to one without it.
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "fp4/data/data.h"
#include "fp4/nn/model.h"

namespace fp4 {

/// An inference reference policy: none, current, replay-d<D>, calibrated.
struct EvalPolicy {
  /// LlamaQ8: "llama-q8_0", llama.cpp's CPU arithmetic on a GGUF export (nn::InferenceRef).
  enum class Kind { None, Current, Replay, Calibrated, LlamaQ8 };
  Kind kind = Kind::Current;
  int interval = 50;  ///< D of Replay (≥ 1); unused otherwise
  /// "none" | "current" | "replay-d<D>" | "calibrated" | "llama-q8_0".
  std::string name() const;
};

/// Parse one policy name: "none", "current", "calibrated", "replay-d<D>" with 1 ≤ D ≤ 10^9
/// ("replay-d50" is the paper's D), "llama-q8_0" (docs/export.md "FP4 weights in GGUF"). Throws fp4::UserError naming the bad value and the
/// accepted names.
EvalPolicy parse_eval_policy(std::string_view name);

/// Parse a comma-separated list of policy names (empty pieces rejected, duplicates removed,
/// order kept). Throws fp4::UserError like parse_eval_policy.
std::vector<EvalPolicy> parse_eval_policies(std::string_view list);

/// The default policies of `fp4train eval`: none, current, replay-d50, calibrated.
std::vector<EvalPolicy> default_eval_policies();

/// UTF-8 bytes one SentencePiece piece stands for in decoded text, context-free: each "▁"
/// (U+2581, the space marker, also the dummy prefix that starts every document) counts 1
/// byte (a space), every other character its UTF-8 length; a byte-fallback piece (is_byte,
/// "<0xNN>") counts 1; control pieces (<s>, </s>) and <unk> count 0.
int piece_utf8_bytes(std::string_view piece, bool is_byte, bool is_control_or_unknown);

/// piece_utf8_bytes of every id of the SentencePiece model `tokenizer_model` ([vocab] ints).
/// With the streams of prepare_tokens, the sum over a whole document's tokens plus its EOS
/// is the document's UTF-8 byte count + 1 (the dummy-prefix space; EOS counts 0).
/// Throws fp4::UserError if the model cannot be loaded (names the file).
std::vector<int> token_byte_lengths(const std::filesystem::path& tokenizer_model);

/// Result of one evaluation.
struct NllResult {
  std::string policy;           ///< EvalPolicy::name()
  double nats_per_token = 0;    ///< mean over windows of the window's mean NLL (all windows
                                ///< have seq_len targets, so this is the token mean); NaN if
                                ///< a quantizer met a non-finite tensor
  double bits_per_byte = 0;     ///< total_nats / ln 2 / bytes; NaN without byte lengths
  double total_nats = 0;        ///< nats_per_token · tokens
  int64_t tokens = 0;           ///< scored target tokens = windows · seq_len
  int64_t bytes = 0;            ///< Σ byte_lengths[target] over the scored targets
  int64_t batches = 0;          ///< evaluation batches (forward calls), in order
  int64_t calib_tokens = 0;     ///< calibrated: input tokens of the calibration batches
  /// Mean NLL (nats/token) of each held-out window, in window order ([windows]): the
  /// per-window values a paired bootstrap over windows resamples (report.h paired_bootstrap;
  /// docs/compare.md "Comparing recipes: `fp4train compare`"). Their mean equals nats_per_token
  /// up to the order of the FP64 sums (about 1e-15 relative). Empty when a quantizer met a
  /// non-finite tensor.
  std::vector<double> window_nll;
};

/// Windows of seq_len + 1 tokens: tokens[starts[i] .. starts[i] + seq_len]. Inputs are the
/// first seq_len, targets the last seq_len.
struct EvalWindows {
  const TokenStream* tokens = nullptr;
  std::vector<int64_t> starts;
};

/// The summed NLL (nats: the batch's mean × its windows) of evaluate_nll's batches
/// b = part, part + parts, part + 2·parts, ... (0-based, `batch` windows each, in order), for
/// a data-parallel evaluation whose ranks then add every batch's sum in batch order, as
/// evaluate_nll does: the mean equals evaluate_nll's bit for bit. Policies whose batches do
/// not depend on earlier ones only (none, current; else std::invalid_argument). The inference
/// state is reset before and after. A NonFiniteError gives NaN sums. Throws what
/// evaluate_nll throws for bad windows or shapes, std::invalid_argument unless
/// 0 ≤ part < parts.
std::vector<double> nll_batch_sums(nn::Model& model, const EvalWindows& data, int seq_len,
                                   int batch, const EvalPolicy& policy, int part, int parts);

/// The calibrated activation reference of every linear (the `calibrated` policy's, docs/
/// evaluation.md "Quantized inference evaluation"): `calib` run through `model` (`batch`
/// windows per forward, current scaling), each linear recording the max over all calls of
/// max|X|. Returns [model.linears().size()] amax values (FP32, 0 for a linear that saw only
/// zeros). The inference state is reset before and after. Throws fp4::UserError for empty or
/// out-of-range windows, std::invalid_argument for bad batch/seq_len.
std::vector<float> calibrated_activation_amax(nn::Model& model, const EvalWindows& calib,
                                              int seq_len, int batch);

/// Held-out NLL of `model` under `policy` over `data` (windows processed `batch` at a time,
/// in order; batch ≤ the model's batch, seq_len its seq_len). The model's inference state
/// is reset first (Model::reset_inference). Calibrated runs `calib` (required, non-empty,
/// else fp4::UserError) through the model first, `batch` windows per forward, recording the
/// max over all of them of each linear's max|X|. `byte_lengths` ([vocab] from
/// token_byte_lengths, or null) gives bits_per_byte. Parameters are left unchanged; logits
/// and the last-forward buffers are overwritten. A NonFiniteError inside a quantized forward
/// gives NaN results instead of throwing. Throws fp4::UserError if data.starts is empty or a
/// window runs past the token stream, std::invalid_argument for bad batch/seq_len.
NllResult evaluate_nll(nn::Model& model, const EvalWindows& data, int seq_len, int batch,
                       const EvalPolicy& policy, const EvalWindows* calib = nullptr,
                       const std::vector<int>* byte_lengths = nullptr);

/// Mean NLL (nats per token) of each of `batches` under `policy`, the batches run in order as
/// one evaluation (as evaluate_nll: the inference state is reset first and after; calibrated
/// runs `calib` first; Replay's clock is the batch index). Each batch is (inputs, targets), both
/// [batch, seq_len] int32 token ids. For the fidelity panel's loss penalty under each inference
/// policy (docs/fidelity.md). A NonFiniteError gives NaN for every batch. Throws fp4::UserError
/// for a calibrated policy without calibration windows, std::invalid_argument for bad shapes.
std::vector<double> evaluate_batches_nll(
    nn::Model& model, const std::vector<std::pair<const int32_t*, const int32_t*>>& batches,
    int seq_len, int batch, const EvalPolicy& policy, const EvalWindows* calib = nullptr);

/// The calibration windows `fp4train eval` uses: the first calib_batches · batch
/// non-overlapping windows of seq_len + 1 tokens (stride seq_len) from the start of the
/// TRAINING split, disjoint from the held-out windows by the document split. Fewer when the
/// split is short; throws fp4::UserError if it holds no window.
EvalWindows calibration_windows(const TokenStream& train_tokens, int seq_len,
                                int batch, int calib_batches);

/// One sequence to score: `tokens` (≤ seq_len + 1 ids: a prefix, then the continuation)
/// and how many of its last tokens are the continuation (1 ≤ continuation < tokens.size()).
struct ScoredSequence {
  std::vector<int32_t> tokens;
  int continuation = 0;
};

/// Σ log p(continuation token | everything before it) in nats (≤ 0) of each sequence, under
/// `policy` (as evaluate_nll: the inference state is reset first; calibrated runs `calib`
/// through the model first). Sequences go `batch` to a forward of length seq_len (at most the
/// model's; shorter rows need less), in order; a row shorter than
/// seq_len + 1 is padded with EOS (id 2) after its end, which a causal model does not see
/// before the scored tokens (quantized inference still measures its activation amax over the
/// whole batch, pads included: fixed, since the rows and pads are). Each sum is the same
/// cross-entropy kernel evaluate_nll uses, over that row's continuation. A NonFiniteError
/// gives NaN scores. Throws std::invalid_argument on a sequence that breaks the rules above
/// or an id outside the vocabulary (UserError), and what evaluate_nll throws for bad shapes.
std::vector<double> continuation_logprobs(nn::Model& model, const std::vector<ScoredSequence>& seqs,
                                          int seq_len, int batch, const EvalPolicy& policy,
                                          const EvalWindows* calib = nullptr);

/// Text generation options (`fp4train sample`).
struct SampleOptions {
  int max_new_tokens = 100;
  double temperature = 0.8;  ///< 0 = greedy (argmax, lowest id on ties)
  int top_k = 40;            ///< 0 = the whole vocabulary
  uint64_t seed = 1;
  EvalPolicy policy;         ///< inference references (Replay's clock = forward calls)
  bool stop_at_eos = true;   ///< stop after generating EOS (id 2)
};

/// Autoregressive sampling from `prompt` (non-empty token ids; the model's batch ≥ 1).
/// Each new token runs one forward (B = 1) over the last min(length, seq_len) tokens, so the
/// context slides once prompt + generated tokens exceed seq_len (positions restart at 0 in
/// the window). Token t (0-based) draws u in [0, 1) and picks by inverse
/// CDF over the top_k highest logits (ties: lower id first) with softmax(logits / T) in double
/// (u = the top 53 bits of splitmix64(seed, t) / 2^53);
/// so the same seed gives the same tokens. For the calibrated policy, `calib` must be given
/// (fp4::UserError otherwise). Returns the generated ids only. Throws std::invalid_argument
/// on an empty prompt or an id outside the vocabulary.
std::vector<int> sample_tokens(nn::Model& model, const std::vector<int>& prompt,
                               const SampleOptions& opt, int seq_len, int batch,
                               const EvalWindows* calib = nullptr);

}  // namespace fp4
