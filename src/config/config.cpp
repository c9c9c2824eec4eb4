// Run configs: TOML → fp4::RunConfig, strictly validated.
#include "fp4/config/config.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "fp4/base/error.h"
#include "fp4/config/toml_reader.h"

namespace fp4 {

namespace {
// train.final_window: an integer is a step count (>= 1; at most train.steps, checked by
// validate), a float a fraction of the steps in (0, 1). A float of 1 or more is refused rather
// than read as a step count, so that `final_window = 1.0` cannot mean one step to one reader
// and the whole run to another.
void parse_final_window(detail::TomlReader& r, TrainConfig& t) {
  const std::string key = "train.final_window";
  if (!r.has(key)) return;
  const std::string want =
      "a fraction of train.steps in (0, 1) (a float, e.g. 0.1 for the last 10%) or a whole "
      "number of steps >= 1 (an integer, e.g. 250)";
  if (r.is_integer(key)) {
    int64_t steps = 0;
    r.get(key, steps);
    if (steps < 1 || steps > (int64_t{1} << 30))
      r.fail(key, want + ", got " + std::to_string(steps));
    t.final_window = static_cast<double>(steps);
  } else {
    double f = 0;
    r.get(key, f);  // refuses a non-number, naming the key
    if (!(f > 0.0 && f < 1.0)) {
      std::ostringstream m;
      m << want << ", got ";
      if (f >= 1.0 && f <= double(int64_t{1} << 30) && f == std::floor(f))
        m << "the float " << static_cast<int64_t>(f) << ".0 (a step count is written as an "
          << "integer: " << static_cast<int64_t>(f) << ")";
      else
        m << f;
      r.fail(key, m.str());
    }
    t.final_window = f;
  }
}

RunConfig parse_run_config(detail::TomlReader& r, const BlockKindRules& kinds) {
  RunConfig c;
  auto& m = c.model;
  r.get("model.vocab_size", m.vocab_size);   r.range("model.vocab_size", m.vocab_size, 256, 1 << 20);
  r.get("model.d_model", m.d_model);         r.range("model.d_model", m.d_model, 8, 16384);
  r.get("model.n_layers", m.n_layers);       r.range("model.n_layers", m.n_layers, 1, 512);
  r.get("model.pattern", m.pattern);
  if (r.has("model.pattern")) {
    if (m.pattern.empty() || m.pattern.size() > 1024 ||
        m.pattern.find_first_not_of(kinds.symbols) != std::string::npos)
      r.fail("model.pattern", "1 to 1024 block characters among " + kinds.listing + ", got \"" +
                                  m.pattern + "\"");
    // A pattern given with --set replaces the file's n_layers; in one file the two conflict.
    if (r.has("model.n_layers") && !(r.from_setting("model.pattern") && !r.from_setting("model.n_layers")))
      r.fail("model.n_layers", "absent when model.pattern is set (the pattern's " +
                                   std::to_string(m.pattern.size()) + " characters are the blocks)");
  }
  r.get("model.n_heads", m.n_heads);         r.range("model.n_heads", m.n_heads, 1, 512);
  r.get("model.n_kv_heads", m.n_kv_heads);   r.range("model.n_kv_heads", m.n_kv_heads, 0, 512);
  r.get("model.head_dim", m.head_dim);       r.range("model.head_dim", m.head_dim, 0, 4096);
  r.get("model.rope", m.rope);
  r.get("model.mamba_num_heads", m.mamba_num_heads);
  r.range("model.mamba_num_heads", m.mamba_num_heads, 0, 4096);
  r.get("model.mamba_head_dim", m.mamba_head_dim);
  r.range("model.mamba_head_dim", m.mamba_head_dim, 1, 4096);
  r.get("model.mamba_n_groups", m.mamba_n_groups);
  r.range("model.mamba_n_groups", m.mamba_n_groups, 1, 4096);
  r.get("model.mamba_state_size", m.mamba_state_size);
  r.range("model.mamba_state_size", m.mamba_state_size, 1, 4096);
  r.get("model.mamba_conv_kernel", m.mamba_conv_kernel);
  r.range("model.mamba_conv_kernel", m.mamba_conv_kernel, 1, 16);
  r.get("model.mamba_chunk_size", m.mamba_chunk_size);
  r.range("model.mamba_chunk_size", m.mamba_chunk_size, 1, 4096);
  r.get("model.mamba_dt_min", m.mamba_dt_min);
  r.range("model.mamba_dt_min", m.mamba_dt_min, 1e-8f, 10.f);
  r.get("model.mamba_dt_max", m.mamba_dt_max);
  r.range("model.mamba_dt_max", m.mamba_dt_max, 1e-8f, 10.f);
  r.get("model.mamba_dt_init_floor", m.mamba_dt_init_floor);
  r.range("model.mamba_dt_init_floor", m.mamba_dt_init_floor, 0.f, 10.f);
  r.get("model.mlp", m.mlp);                 r.choice("model.mlp", m.mlp, {"squared_relu", "swiglu"});
  r.get("model.mlp_hidden", m.mlp_hidden);   r.range("model.mlp_hidden", m.mlp_hidden, 1, 1 << 17);
  r.get("model.rope_theta", m.rope_theta);   r.range("model.rope_theta", m.rope_theta, 1.f, 1e9f);
  r.get("model.norm_eps", m.norm_eps);       r.range("model.norm_eps", m.norm_eps, 0.f, 1.f);
  r.get("model.init_std", m.init_std);       r.range("model.init_std", m.init_std, 1e-6f, 1.f);
  auto& t = c.train;
  r.get("train.seq_len", t.seq_len);         r.range("train.seq_len", t.seq_len, 2, 1 << 16);
  r.get("train.batch_size", t.batch_size);   r.range("train.batch_size", t.batch_size, 1, 1 << 16);
  r.get("train.micro_batch_size", t.micro_batch_size);
  r.range("train.micro_batch_size", t.micro_batch_size, 0, 1 << 16);
  r.get("train.steps", t.steps);             r.range("train.steps", t.steps, 1, 1 << 30);
  r.get("train.lr", t.lr);                   r.range("train.lr", t.lr, 0.0, 1e9);
  r.get("train.warmup_steps", t.warmup_steps); r.range("train.warmup_steps", t.warmup_steps, 0, 1 << 30);
  r.get("train.decay_fraction", t.decay_fraction); r.range("train.decay_fraction", t.decay_fraction, 0.0, 1.0);
  r.get("train.min_lr_ratio", t.min_lr_ratio); r.range("train.min_lr_ratio", t.min_lr_ratio, 0.0, 1.0);
  r.get("train.weight_decay", t.weight_decay); r.range("train.weight_decay", t.weight_decay, 0.0, 10.0);
  r.get("train.beta1", t.beta1);             r.range("train.beta1", t.beta1, 0.0, 0.999999);
  r.get("train.beta2", t.beta2);             r.range("train.beta2", t.beta2, 0.0, 0.999999);
  r.get("train.eps", t.eps);                 r.range("train.eps", t.eps, 0.0, 1.0);
  r.get("train.grad_clip", t.grad_clip);     r.range("train.grad_clip", t.grad_clip, 0.0, 1e30);
  parse_final_window(r, t);
  int64_t seed = static_cast<int64_t>(t.seed);
  r.get("train.seed", seed);                 r.range<int64_t>("train.seed", seed, 0, INT64_MAX);
  t.seed = static_cast<uint64_t>(seed);
  r.get("train.sr_seed", t.sr_seed);         r.range<int64_t>("train.sr_seed", t.sr_seed, -1, INT64_MAX);
  r.get("data.path", c.data.path);
  r.get("data.cache", c.data.cache);
  r.get("data.format", c.data.format);
  {
    // The names of fp4::data_format_names() (the data room, above this one).
    static const char* kFormats[] = {"auto", "text", "jsonl", "llmc", "uint16", "uint32"};
    bool known = false;
    for (const char* f : kFormats) known = known || c.data.format == f;
    if (!known)
      throw UserError(r.file() + ": data.format = '" + c.data.format +
                      "' is not one of auto, text, jsonl, llmc, uint16, uint32");
  }
  r.get("data.text_field", c.data.text_field);
  if (c.data.text_field.empty()) throw UserError(r.file() + ": data.text_field must not be empty");
  r.get("data.skip_bad_records", c.data.skip_bad_records);
  r.get("data.heldout", c.data.heldout);
  r.get("data.heldout_fraction", c.data.heldout_fraction);
  if (!(c.data.heldout_fraction >= 0 && c.data.heldout_fraction < 1))
    throw UserError(r.file() + ": data.heldout_fraction must be in [0, 1) (0: not used), got " +
                    std::to_string(c.data.heldout_fraction));
  r.get("data.tokenizer", c.data.tokenizer);
  r.get("eval.interval", c.eval.interval);   r.range("eval.interval", c.eval.interval, 1, 1 << 30);
  r.get("eval.windows", c.eval.windows);     r.range("eval.windows", c.eval.windows, 1, 1 << 20);
  r.get("log.progress_seconds", c.progress_seconds);
  r.range("log.progress_seconds", c.progress_seconds, 0.0, 3600.0);
  r.get("log.telemetry_interval", c.telemetry_interval);
  r.range("log.telemetry_interval", c.telemetry_interval, 0, 1 << 30);
  r.reject_unknown();
  validate_run_config(c, r.file(), kinds);
  return c;
}
}  // namespace

BlockKindRules any_block_kinds() {
  BlockKindRules r;
  for (char c = '!'; c <= '~'; ++c)
    if (c != '"' && c != '\'' && c != '\\') r.symbols += c;
  r.listing = "printable characters";
  return r;
}

RunConfig parse_run_config_file(const std::filesystem::path& file, const std::vector<Setting>& sets,
                                const BlockKindRules& kinds) {
  if (!std::filesystem::exists(file))
    throw UserError(file.string() + ": file not found (a run config TOML; 'fp4train configs' "
                    "lists the shipped ones)");
  detail::TomlReader r(file);
  r.apply(sets);
  return parse_run_config(r, kinds);
}

RunConfig parse_run_config_text(const std::string& toml, const std::string& where,
                                const BlockKindRules& kinds) {
  detail::TomlReader r(detail::TomlReader::FromText{}, toml, where);
  return parse_run_config(r, kinds);
}

int TrainConfig::final_window_steps() const {
  if (final_window >= 1.0) return static_cast<int>(std::min<double>(final_window, steps));
  const double w = std::floor(final_window * steps + 1e-6);
  return std::max(1, static_cast<int>(std::min<double>(w, steps)));
}

std::string ModelConfig::block_pattern() const {
  if (!pattern.empty()) return pattern;
  std::string p;
  for (int l = 0; l < n_layers; ++l) p += "*-";
  return p;
}

void validate_run_config(const RunConfig& c, const std::string& where, const BlockKindRules& kinds) {
  auto err = [&](const std::string& what) { throw UserError(where + ": " + what); };
  if (kinds.check) kinds.check(c.model, err);
  if (c.train.batch_size % c.train.micro() != 0)
    err("train.batch_size (" + std::to_string(c.train.batch_size) + ") must be a multiple of "
        "train.micro_batch_size (" + std::to_string(c.train.micro_batch_size) + ")");
  if (c.train.final_window >= 1.0 && c.train.final_window > c.train.steps)
    err("train.final_window (" + std::to_string(static_cast<int64_t>(c.train.final_window)) +
        " steps) must not exceed train.steps (" + std::to_string(c.train.steps) +
        "); a fraction of the steps, e.g. 0.1, fits any train.steps");
  if (c.train.warmup_steps >= c.train.steps && c.train.steps > 1)
    throw UserError(where + ": train.warmup_steps (" + std::to_string(c.train.warmup_steps) +
                    ") must be smaller than train.steps (" + std::to_string(c.train.steps) + ")");
}

namespace {
// A floating-point value as detail::toml_number writes it (exact: a resumed run reloads this
// text bit for bit and compares it with the checkpoint's), made a TOML float where TOML
// would read the integer-looking text as something else: -0 (the integer 0, so -0.0
// re-serialised as "0") and integers of 2^53 or more (to_chars writes e.g.
// 12345678901234567000, beyond TOML's 64-bit integers). Other integral values keep their
// integer spelling ("rope_theta = 10000"), as the configs stored in existing checkpoints
// have it. Found by tests/fuzz/fuzz_config.cpp.
template <class T>
std::string toml_number(T v) {
  std::string s = detail::toml_number(v);
  if (s.find_first_of(".eEn") == std::string::npos &&
      ((v == 0 && std::signbit(v)) || std::fabs(static_cast<double>(v)) >= 9007199254740992.0))
    s += ".0";
  return s;
}
}  // namespace

std::string run_config_to_toml(const RunConfig& c) {
  std::ostringstream o;
  const auto& m = c.model;
  const auto& t = c.train;
  // Keys added with the hybrid model are written only where they differ from their defaults.
  o << "[model]\nvocab_size = " << m.vocab_size << "\nd_model = " << m.d_model;
  // Always the pattern, never n_layers: the run's blocks are what the recipe rules count
  // (a run made before the hybrid model, whose config.toml has n_layers, is not the same
  // config to compare and resume).
  o << "\npattern = " << detail::toml_quote(m.block_pattern());
  o << "\nn_heads = " << m.n_heads;
  if (m.n_kv_heads) o << "\nn_kv_heads = " << m.n_kv_heads;
  if (m.head_dim) o << "\nhead_dim = " << m.head_dim;
  if (!m.rope) o << "\nrope = false";
  o << "\nmlp = \"" << m.mlp
    << "\"\nmlp_hidden = " << m.mlp_hidden << "\nrope_theta = " << toml_number(m.rope_theta)
    << "\nnorm_eps = " << toml_number(m.norm_eps) << "\ninit_std = " << toml_number(m.init_std);
  if (m.block_pattern().find('M') != std::string::npos)
    o << "\nmamba_num_heads = " << m.mamba_num_heads << "\nmamba_head_dim = " << m.mamba_head_dim
      << "\nmamba_n_groups = " << m.mamba_n_groups << "\nmamba_state_size = " << m.mamba_state_size
      << "\nmamba_conv_kernel = " << m.mamba_conv_kernel
      << "\nmamba_chunk_size = " << m.mamba_chunk_size
      << "\nmamba_dt_min = " << toml_number(m.mamba_dt_min)
      << "\nmamba_dt_max = " << toml_number(m.mamba_dt_max)
      << "\nmamba_dt_init_floor = " << toml_number(m.mamba_dt_init_floor);
  o << "\n\n";
  o << "[train]\nseq_len = " << t.seq_len << "\nbatch_size = " << t.batch_size;
  // Only when it splits the batch: configs without micro-batching keep their text (resume
  // and compare's reuse compare it).
  if (t.micro() != t.batch_size) o << "\nmicro_batch_size = " << t.micro_batch_size;
  o << "\nsteps = " << t.steps << "\nlr = " << toml_number(t.lr)
    << "\nwarmup_steps = " << t.warmup_steps
    << "\ndecay_fraction = " << toml_number(t.decay_fraction)
    << "\nmin_lr_ratio = " << toml_number(t.min_lr_ratio)
    << "\nweight_decay = " << toml_number(t.weight_decay) << "\nbeta1 = " << toml_number(t.beta1)
    << "\nbeta2 = " << toml_number(t.beta2) << "\neps = " << toml_number(t.eps)
    << "\ngrad_clip = " << toml_number(t.grad_clip);
  // Only when it is not the default: the texts of earlier configs stay as they were (resume
  // and compare's reuse compare them). A step count as an integer, a fraction as a float.
  if (t.final_window != TrainConfig{}.final_window) {
    if (t.final_window >= 1.0)
      o << "\nfinal_window = " << static_cast<int64_t>(t.final_window);
    else
      o << "\nfinal_window = " << toml_number(t.final_window);
  }
  o << "\nseed = " << t.seed;
  if (t.sr_seed >= 0) o << "\nsr_seed = " << t.sr_seed;  // only when set: older texts unchanged
  o << "\n\n";
  o << "[data]\npath = " << detail::toml_quote(c.data.path)
    << "\ncache = " << detail::toml_quote(c.data.cache);
  // The keys of other sources only where they differ from the default: the texts of
  // earlier configs stay as they were.
  const DataConfig d0;
  if (c.data.format != d0.format) o << "\nformat = " << detail::toml_quote(c.data.format);
  if (c.data.text_field != d0.text_field) o << "\ntext_field = " << detail::toml_quote(c.data.text_field);
  if (c.data.skip_bad_records) o << "\nskip_bad_records = true";
  if (!c.data.heldout.empty()) o << "\nheldout = " << detail::toml_quote(c.data.heldout);
  if (c.data.heldout_fraction != 0) o << "\nheldout_fraction = " << toml_number(c.data.heldout_fraction);
  if (!c.data.tokenizer.empty()) o << "\ntokenizer = " << detail::toml_quote(c.data.tokenizer);
  o << "\n\n";
  o << "[eval]\ninterval = " << c.eval.interval << "\nwindows = " << c.eval.windows << "\n\n";
  o << "[log]\nprogress_seconds = " << toml_number(c.progress_seconds)
    << "\ntelemetry_interval = " << c.telemetry_interval << "\n";
  return o.str();
}

std::vector<std::string> toml_names(const std::filesystem::path& dir) {
  namespace fs = std::filesystem;
  std::vector<std::string> names;
  std::error_code ec;
  if (fs::is_directory(dir, ec))
    for (auto& e : fs::directory_iterator(dir, ec))
      if (e.path().extension() == ".toml") names.push_back(e.path().stem().string());
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace fp4
