// One training step (train_step): the step's batch, micro-batches forward and backward, their
// gradients summed in the fixed tree over every process, clipping and AdamW; and the checks
// and reference agreement it needs under mpirun.
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "fp4/base/error.h"
#include "fp4/base/profile.h"
#include "fp4/dist/dist.h"
#include "fp4/numerics/telemetry.h"
#include "fp4/train/train.h"

namespace fp4 {

namespace {
// A non-finite loss or tensor met in one micro-batch of this process.
struct MicroDiverged {
  std::string what;
};

// The data-parallel agreement on references (Recipe::amax_ranks).
class MpiReferences final : public nn::RankReferences {
 public:
  explicit MpiReferences(AmaxRanks rule) : rule_(rule) {}
  float agree(float local, bool sample) override {
    if (rule_ == AmaxRanks::Max) return dist::max_over_ranks(local);
    return sample ? dist::bcast_from_rank0(local) : local;
  }

 private:
  AmaxRanks rule_;
};

// Micro-batch m of the step (this process's first is `first`): forward and backward from
// zeroed gradients; its gradient is then in model.grads(). Throws MicroDiverged.
double run_micro(nn::Model& model, nn::StepContext& ctx, const int32_t* inputs,
                 const int32_t* targets, int micro, int64_t rows, int m, int first) {
  model.zero_grad();
  ctx.micro = m;
  ctx.first_micro = m == first;
  try {
    const double loss =
        model.forward(inputs + int64_t(m) * rows, targets + int64_t(m) * rows, micro, ctx);
    if (!std::isfinite(loss))
      throw MicroDiverged{"non-finite training loss (" + std::to_string(loss) +
                          ") in micro-batch " + std::to_string(m)};
    model.backward(ctx);
    return loss;
  } catch (const NonFiniteError& e) {
    throw MicroDiverged{std::string("non-finite tensor (") + e.what() + ") in micro-batch " +
                        std::to_string(m)};
  }
}
}  // namespace

void check_process_count(const RunConfig& cfg, bool resume) {
  const int n = cfg.train.n_micro(), P = dist::size();
  if (n % P == 0) return;
  throw UserError("train.batch_size / train.micro_batch_size = " + std::to_string(n) +
                  " micro-batches per step cannot be spread evenly over " + std::to_string(P) +
                  " processes (mpirun -np): use a process count that divides it" +
                  (resume ? std::string(" (a resumed run keeps its micro-batches)")
                          : std::string(", or change train.micro_batch_size")));
}

std::unique_ptr<nn::RankReferences> rank_references(const Recipe& recipe) {
  if (dist::size() == 1) return nullptr;
  return std::make_unique<MpiReferences>(recipe.amax_ranks);
}

StepResult train_step(nn::Model& model, AdamW& optimizer, BatchSampler& sampler,
                      const RunConfig& cfg, const Recipe& recipe, int step,
                      std::vector<int32_t>& inputs, std::vector<int32_t>& targets) {
  thread_local StepBuffers buffers;
  MpiReferences ranks(recipe.amax_ranks);  // agrees across processes under mpirun
  return train_step(model, optimizer, sampler, cfg, recipe, step, inputs, targets, buffers,
                    dist::size() > 1 ? &ranks : nullptr);
}

StepResult train_step(nn::Model& model, AdamW& optimizer, BatchSampler& sampler,
                      const RunConfig& cfg, const Recipe& recipe, int step,
                      std::vector<int32_t>& inputs, std::vector<int32_t>& targets,
                      StepBuffers& buf, nn::RankReferences* ranks) {
  using prof::Cat;
  using prof::Scope;
  const auto& tc = cfg.train;
  check_process_count(cfg);
  const int n = tc.n_micro(), P = dist::size();
  StepResult r;
  {
    Scope s(Cat::kData);
    sampler.next(inputs.data(), targets.data());
  }
  nn::StepContext ctx;
  ctx.step = step;
  ctx.seed = tc.sr_key_seed();
  ctx.hadamard_seed = tc.seed;  // the Hadamard signs follow the run seed, never sr_seed
  ctx.ranks = ranks;
  ctx.telemetry = r.telemetry = cfg.telemetry_interval > 0 && recipe.mode == LinearMode::FP4 &&
                                (step == 1 || step % cfg.telemetry_interval == 0);
  const int64_t len = model.num_params();
  if (n == 1 && P == 1) {
    // One forward per step: the gradient is the model's own.
    model.zero_grad();
    try {
      r.loss = model.forward(inputs.data(), targets.data(), tc.batch_size, ctx);
      if (!std::isfinite(r.loss)) {
        r.diverged = "non-finite training loss (" + std::to_string(r.loss) + ")";
        return r;
      }
      model.backward(ctx);
    } catch (const NonFiniteError& e) {
      // A quantizer met NaN/Inf activations or gradients before the loss showed it.
      r.diverged = std::string("non-finite tensor (") + e.what() + ")";
      return r;
    }
  } else {
    const int k = n / P, a = dist::rank() * k, b = a + k;
    if (!buf.tree || buf.tree_n != n || buf.tree_a != a ||
        buf.tree_len != len) {
      buf.tree = std::make_unique<dist::TreeAccumulator>(n, a, b, len);
      buf.tree_n = n, buf.tree_a = a, buf.tree_len = len;
    }
    buf.tree->reset();
    buf.losses.resize(size_t(k));
    const int64_t rows = int64_t(tc.micro()) * tc.seq_len;
    try {
      for (int m = a; m < b; ++m) {
        buf.losses[size_t(m - a)] =
            run_micro(model, ctx, inputs.data(), targets.data(), tc.micro(), rows, m, a);
        prof::Scope s(Cat::kOther);
        buf.tree->add(model.grads().data());
      }
    } catch (const MicroDiverged& e) {
      r.diverged = e.what;
      r.diverged_on_this_rank = P > 1;
      return r;
    }
    dist::reduce_mean(n, buf.tree->node_sums(), len, model.grads().data());
    // The step's loss: the mean of the micro-batch losses, in micro-batch order.
    buf.all_losses.resize(size_t(n));
    dist::allgather(buf.losses.data(), k, buf.all_losses.data());
    double sum = 0;
    for (int m = 0; m < n; ++m) sum += buf.all_losses[size_t(m)];
    r.loss = sum / n;
    if (ctx.telemetry && P > 1) {
      // The worst of every statistic over the ranks (each holds the worst of its micro-batches).
      constexpr int kF = 6, kO = nn::LinearTelemetry::kOperands;
      auto& lin = model.linears();
      buf.tel.assign(lin.size() * kO * kF, 0.0);
      for (size_t i = 0; i < lin.size(); ++i)
        for (int o = 0; o < kO; ++o) {
          const QuantStats& q = lin[i].telemetry().op[o];
          double* t = &buf.tel[(i * kO + size_t(o)) * kF];
          t[0] = q.saturated_blocks, t[1] = q.zero_guard_blocks, t[2] = q.zeroed_nonzeros;
          t[3] = q.rel_error, t[4] = q.staleness, t[5] = q.has_staleness ? 1 : 0;
        }
      dist::max_over_ranks(buf.tel.data(), int64_t(buf.tel.size()));
      for (size_t i = 0; i < lin.size(); ++i)
        for (int o = 0; o < kO; ++o) {
          QuantStats& q = lin[i].telemetry_for_reduction().op[o];
          const double* t = &buf.tel[(i * kO + size_t(o)) * kF];
          q.saturated_blocks = t[0], q.zero_guard_blocks = t[1], q.zeroed_nonzeros = t[2];
          q.rel_error = t[3], q.staleness = t[4], q.has_staleness = t[5] != 0;
        }
    }
  }
  {
    Scope s(Cat::kGradClip);
    r.grad_norm = clip_grad_norm(model.grads().data(), model.num_params(), tc.grad_clip);
  }
  r.lr = wsd_lr(tc, step);
  if (!std::isfinite(r.grad_norm)) {
    r.diverged = "non-finite gradient norm";
    return r;
  }
  Scope s(Cat::kOptimizer);
  optimizer.step(model.params().data(), model.grads().data(), model.param_infos(), r.lr, step);
  return r;
}

}  // namespace fp4
