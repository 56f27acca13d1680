#pragma once
#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "dtrain/core/error.hpp"
#include "dtrain/runtime/session.hpp"
#include "dtrain/train/objects.hpp"
#include "dtrain/train/powersgd.hpp"
#include "dtrain/train/powersgd_core.hpp"

namespace dtrain {

DTRAIN_API PowerSGDHook::PowerSGDHook(PowerSGDOptions o) : options_(o) {
  if (o.rank < 1)
    throw InvalidArgumentError(fmt::format(
        "dtrain: PowerSGDOptions::rank = {}: must be at least 1 (the columns of P and Q)", o.rank));
  if (o.start_step < 0)
    throw InvalidArgumentError(fmt::format(
        "dtrain: PowerSGDOptions::start_step = {}: must be at least 0 (0 compresses from the "
        "first step)",
        o.start_step));
  if (!std::isfinite(o.min_compression_rate) || o.min_compression_rate < 0)
    throw InvalidArgumentError(fmt::format(
        "dtrain: PowerSGDOptions::min_compression_rate = {}: must be a finite number, at least 0",
        o.min_compression_rate));
  if (!std::isfinite(o.orthogonalization_epsilon) || o.orthogonalization_epsilon < 0)
    throw InvalidArgumentError(fmt::format(
        "dtrain: PowerSGDOptions::orthogonalization_epsilon = {}: must be a finite number, at "
        "least 0",
        o.orthogonalization_epsilon));
  core_ = std::make_shared<detail::PowerSGDCore>(options_);
}

DTRAIN_API PowerSGDHook::~PowerSGDHook() = default;

DTRAIN_API std::string PowerSGDHook::settings() const {
  const auto& o = options_;
  return fmt::format(
      "powersgd rank={} start_step={} min_compression_rate={} error_feedback={} warm_start={} "
      "seed={} orthogonalization_epsilon={}",
      o.rank, o.start_step, o.min_compression_rate, o.error_feedback, o.warm_start, o.seed,
      o.orthogonalization_epsilon);
}

DTRAIN_API std::unique_ptr<PendingGradients> PowerSGDHook::start(GradientBucket bucket) {
  using namespace detail;
  if (bucket.names.size() != bucket.gradients.size())
    throw InvalidArgumentError(
        fmt::format("dtrain: PowerSGD: the bucket has {} gradients and {} names",
                    bucket.gradients.size(), bucket.names.size()));
  const ReduceOp op = bucket.options.op;
  if (op != ReduceOp::Average && op != ReduceOp::Sum)
    throw InvalidArgumentError(fmt::format(
        "dtrain: PowerSGD: the bucket asks for ReduceOp::{}: PowerSGD combines gradients with "
        "Average or Sum",
        op));
  for (std::size_t i = 0; i < bucket.gradients.size(); ++i)
    if (bucket.gradients[i].device.is_cuda())
      throw InvalidArgumentError(fmt::format(
          "dtrain: PowerSGD: gradient '{}' is on {}: PowerSGD is built for host gradients (its "
          "products run on the CPU), not for the device; use allreduce_hook() or "
          "compression_hook() for device gradients",
          bucket.names[i], bucket.gradients[i].device));
  bucket.step = core_->hook_step(bucket.step);
  if (bucket.step < options_.start_step) return core_->plain->start(std::move(bucket));

  const double scale = bucket.options.prescale * bucket.options.postscale *
                       (op == ReduceOp::Sum ? bucket.options.process_set.size() : 1);
  if (!std::isfinite(scale) || scale == 0)
    throw InvalidArgumentError(fmt::format(
        "dtrain: PowerSGD: prescale {} and postscale {}: their product must be finite and not 0",
        bucket.options.prescale, bucket.options.postscale));

  auto work = std::make_shared<PowerSGDWork>();
  work->q_options = bucket.options;
  work->scale = scale;
  GradientBucket plain;
  plain.options = bucket.options;
  plain.step = bucket.step;
  {
    std::lock_guard lock(core_->mutex);
    try {
      for (std::size_t i = 0; i < bucket.gradients.size(); ++i) {
        const auto& g = bucket.gradients[i];
        const auto& name = bucket.names[i];
        const auto s = compressed_shape(g, name, options_);
        if (!s) {
          plain.gradients.push_back(g);
          plain.names.push_back(name);
          continue;
        }
        auto mx = core_->matrix_for(name, s->rows, s->cols, s->rank, g.dtype);
        mx->busy = true;
        work->compressed.push_back(
            CompressedGradient{g, name, std::move(mx), {}, {}, {}, false, {}});
      }
    } catch (...) {
      for (auto& c : work->compressed) c.matrix->busy = false;
      throw;
    }
  }
  try {
    if (!plain.gradients.empty()) work->plain = core_->plain->start(std::move(plain));
    for (auto& c : work->compressed) {
      if (c.gradient.dtype == DataType::float32)
        post_p<float>(c, options_, bucket);
      else
        post_p<double>(c, options_, bucket);
    }
  } catch (...) {
    for (auto& c : work->compressed) {
      try {
        if (c.p_handle.valid()) c.p_handle.wait();
      } catch (...) {
        // The error being thrown is the one to report.
      }
      std::lock_guard lock(core_->mutex);
      c.matrix->busy = false;
    }
    throw;
  }
  if (!work->compressed.empty()) {
    std::lock_guard lock(core_->mutex);
    core_->started.push_back(work);
  }
  return std::make_unique<PowerSGDPending>(core_, std::move(work));
}

DTRAIN_API PowerSGDState PowerSGDHook::gather_state() {
  PowerSGDState out;
  out.settings = settings();
  out.rank = options_.rank;
  out.world_size = size();
  std::map<std::string, std::vector<double>> mine;  // this rank's errors
  {
    std::lock_guard lock(core_->mutex);
    if (core_->in_flight())
      throw InvalidArgumentError(
          "dtrain: PowerSGDHook::gather_state: a bucket is still in flight: call it after the "
          "optimizer's step() (or synchronize()), on every rank");
    out.step = core_->resume_at.value_or(core_->next_step);
    for (const auto& [name, mx] : core_->matrices) {
      out.matrices[name] = {mx->rows, mx->cols, mx->rank, mx->summed, mx->q, {}};
      if (!options_.error_feedback) continue;
      mine[name] = mx->dtype == DataType::float32 ? detail::widened<float>(mx->error)
                                                  : detail::widened<double>(mx->error);
    }
    for (const auto& [name, s] : core_->restored) {  // loaded, not used since
      out.matrices[name] = {s.rows, s.cols, s.rank, s.summed, s.q, {}};
      if (options_.error_feedback && !s.errors.empty()) mine[name] = s.errors.front();
    }
  }
  if (!options_.error_feedback) return out;
  auto all = allgather_object(mine);
  for (auto& [name, m] : out.matrices) {
    m.errors.resize(all.size());
    for (std::size_t r = 0; r < all.size(); ++r)
      if (auto it = all[r].find(name); it != all[r].end()) m.errors[r] = std::move(it->second);
  }
  return out;
}

DTRAIN_API void PowerSGDHook::load_state(const PowerSGDState& state) {
  const auto fail = [&](const std::string& why) {
    return InvalidArgumentError("dtrain: PowerSGDHook::load_state: " + why);
  };
  if (state.rank != options_.rank)
    throw fail(
        fmt::format("the state was saved by a hook of rank {} ('{}'); this one has rank {}: "
                    "its Qs do not fit",
                    state.rank, state.settings, options_.rank));
  if (state.world_size < 1 || state.step < 0)
    throw fail(fmt::format("world_size = {}, step = {}", state.world_size, state.step));
  const int me = rank();
  const int now = size();
  std::map<std::string, PowerSGDState::Matrix> restored;
  for (const auto& [name, s] : state.matrices) {
    const auto elements = static_cast<std::size_t>(s.rows * s.cols);
    bool ok = s.rows > 0 && s.cols > 0 && s.rank >= 1 && s.rank <= std::min(s.rows, s.cols) &&
              (s.q.empty() || s.q.size() == static_cast<std::size_t>(s.cols * s.rank)) &&
              (s.errors.empty() || s.errors.size() == static_cast<std::size_t>(state.world_size));
    for (const auto& e : s.errors) ok = ok && (e.empty() || e.size() == elements);
    if (!ok) throw fail(fmt::format("the state of gradient '{}' is malformed", name));
    PowerSGDState::Matrix r{s.rows, s.cols, s.rank, s.summed, s.q, {}};
    if (options_.error_feedback && !s.errors.empty()) {
      // Note [PowerSGD state in checkpoints]
      if (state.world_size == now) {
        if (!s.errors[static_cast<std::size_t>(me)].empty())
          r.errors.push_back(s.errors[static_cast<std::size_t>(me)]);
      } else {
        std::vector<double> e(elements, 0.0);
        for (const auto& saved : s.errors)
          for (std::size_t i = 0; i < saved.size(); ++i) e[i] += saved[i];
        const double divisor = s.summed ? now : static_cast<double>(state.world_size);
        for (double& v : e) v /= divisor;
        r.errors.push_back(std::move(e));
      }
    }
    restored.emplace(name, std::move(r));
  }
  std::lock_guard lock(core_->mutex);
  if (core_->in_flight())
    throw fail("a bucket is still in flight: load the state before training, or after a step()");
  core_->matrices.clear();
  core_->restored = std::move(restored);
  core_->resume_at = state.step;
  core_->next_step = state.step;
}

DTRAIN_API std::shared_ptr<PowerSGDHook> powersgd_hook(PowerSGDOptions options) {
  return std::make_shared<PowerSGDHook>(options);
}

}  // namespace dtrain
