#pragma once
// PowerSGD's machinery, internal (Note [PowerSGD] in train/powersgd.hpp): each gradient's state
// kept by name, the buckets in flight, and the two rounds of communication.
#include <algorithm>
#include <chrono>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "dtrain/core/error.hpp"
#include "dtrain/runtime/collectives.hpp"
#include "dtrain/tensor/view.hpp"
#include "dtrain/train/powersgd.hpp"
#include "dtrain/train/powersgd_math.hpp"

namespace dtrain::detail {

template <class T>
std::vector<double> widened(const OwnedTensor& t) {
  const T* p = static_cast<const T*>(t.data());
  return std::vector<double>(p, p + t.numel());
}

// One gradient's state, kept by name from step to step.
struct PowerSGDMatrix {
  std::int64_t rows = 0, cols = 0;
  int rank = 0;
  DataType dtype = DataType::float32;
  std::vector<double> q;  // the last reduced Q (warm start); empty: none yet
  bool summed = false;
  OwnedTensor p_wire, q_wire, error;  // in dtype; error empty without error feedback
  bool busy = false;                  // in a bucket in flight
};

// One compressed gradient of a bucket in flight.
struct CompressedGradient {
  TensorView gradient;
  std::string name;
  std::shared_ptr<PowerSGDMatrix> matrix;
  Handle p_handle, q_handle;
  std::vector<double> p;  // P after the allreduce, orthonormalized
  bool q_posted = false;  // or its P failed: error holds why
  std::exception_ptr error;
};

struct PowerSGDWork {
  std::vector<CompressedGradient> compressed;
  std::unique_ptr<PendingGradients> plain;  // the gradients that travel as they are
  AllreduceOptions q_options;
  double scale = 1;  // Note [PowerSGD]: "Scales"
  bool finished = false;
};

class PowerSGDCore {
 public:
  explicit PowerSGDCore(PowerSGDOptions o) : options_(o) {}

  std::mutex mutex;  // matrices, restored, started
  std::map<std::string, std::shared_ptr<PowerSGDMatrix>> matrices;
  std::map<std::string, PowerSGDState::Matrix> restored;  // errors: this rank's, or none
  std::vector<std::shared_ptr<PowerSGDWork>> started;     // buckets whose Q round is not posted
  const std::shared_ptr<GradientHook> plain = allreduce_hook();  // what travels as it is
  // Note [PowerSGD state in checkpoints]: the hook's step is the bucket's plus `offset`, which
  // load_state() has the next bucket set so that its step is `resume_at`.
  std::optional<std::int64_t> resume_at;
  std::int64_t offset = 0;
  std::int64_t next_step = 0;  // one past the last step started

  // The hook's step for a bucket of optimizer step `step`.
  std::int64_t hook_step(std::int64_t step) {
    std::lock_guard lock(mutex);
    if (resume_at) {
      offset = *resume_at - step;
      resume_at.reset();
    }
    next_step = std::max(next_step, step + offset + 1);
    return step + offset;
  }

  bool in_flight() const {
    if (!started.empty()) return true;
    for (const auto& [name, m] : matrices)
      if (m->busy) return true;
    return false;
  }

  // The matrix of gradient `name` for this step; the caller holds `mutex`.
  std::shared_ptr<PowerSGDMatrix> matrix_for(const std::string& name, std::int64_t n,
                                             std::int64_t m, int r, DataType dtype) {
    const auto known = matrices.find(name);
    if (known != matrices.end()) {
      const PowerSGDMatrix& mx = *known->second;
      if (mx.busy)
        throw InvalidArgumentError(fmt::format(
            "dtrain: PowerSGD: gradient '{}' was handed over again while a bucket holding it is "
            "still in flight: each gradient travels in one bucket per step",
            name));
      // Another shape or dtype under the same name is another gradient: it starts afresh.
      if (mx.rows == n && mx.cols == m && mx.rank == r && mx.dtype == dtype) return known->second;
    }
    auto fresh = std::make_shared<PowerSGDMatrix>();
    fresh->rows = n;
    fresh->cols = m;
    fresh->rank = r;
    fresh->dtype = dtype;
    fresh->p_wire = OwnedTensor(dtype, Shape{n, r});
    fresh->q_wire = OwnedTensor(dtype, Shape{m, r});
    if (options_.error_feedback) fresh->error = OwnedTensor(dtype, Shape{n, m});
    if (auto it = restored.find(name); it != restored.end()) {
      const auto& s = it->second;
      if (s.rows != n || s.cols != m || s.rank != r)
        throw InvalidArgumentError(fmt::format(
            "dtrain: PowerSGD: gradient '{}' is a {} x {} matrix of rank {}, but the loaded "
            "PowerSGDState has it as {} x {} of rank {}: the state belongs to another model",
            name, n, m, r, s.rows, s.cols, s.rank));
      fresh->q = s.q;
      fresh->summed = s.summed;
      if (options_.error_feedback && !s.errors.empty()) {
        const auto& e = s.errors.front();
        for (std::int64_t i = 0; i < n * m; ++i) {
          if (dtype == DataType::float32)
            static_cast<float*>(fresh->error.data())[i] = static_cast<float>(e[i]);
          else
            static_cast<double*>(fresh->error.data())[i] = e[i];
        }
      }
      restored.erase(it);
    }
    matrices[name] = fresh;
    return fresh;
  }

  // Posts the Q round of every started bucket whose Ps are in; drops those that are done.
  void advance() {
    std::vector<std::shared_ptr<PowerSGDWork>> works;
    {
      std::lock_guard lock(mutex);
      works = started;
    }
    for (auto& w : works)
      for (auto& c : w->compressed)
        if (!c.q_posted && c.p_handle.poll()) post_q(*w, c);
    std::lock_guard lock(mutex);
    std::erase_if(started, [](const auto& w) {
      for (const auto& c : w->compressed)
        if (!c.q_posted) return false;
      return true;
    });
  }

  // Note [PowerSGD]: the Q round of every started bucket moves while this one waits.
  void finish(PowerSGDWork& own) {
    if (own.finished) return;
    own.finished = true;
    for (;;) {
      Handle next;
      {
        std::lock_guard progress(progress_mutex_);
        advance();
        std::lock_guard lock(mutex);
        for (auto& c : own.compressed)
          if (!c.q_posted && !next.valid()) next = c.p_handle;
        for (auto& w : started)
          for (auto& c : w->compressed)
            if (!c.q_posted && !next.valid()) next = c.p_handle;
      }
      if (!next.valid()) break;
      try {
        next.wait_for(std::chrono::milliseconds(1));
      } catch (...) {
        // advance() records the op's error with its gradient.
      }
    }
    std::exception_ptr first;
    for (auto& c : own.compressed) {
      try {
        if (c.error) std::rethrow_exception(c.error);
        c.q_handle.wait();
        if (c.matrix->dtype == DataType::float32)
          complete<float>(own, c);
        else
          complete<double>(own, c);
      } catch (...) {
        if (!first) first = std::current_exception();
      }
      std::lock_guard lock(mutex);
      c.matrix->busy = false;
    }
    try {
      if (own.plain) own.plain->wait();
    } catch (...) {
      if (!first) first = std::current_exception();
    }
    if (first) std::rethrow_exception(first);
  }

 private:
  void post_q(PowerSGDWork& w, CompressedGradient& c) {
    c.q_posted = true;
    try {
      c.p_handle.wait();  // done: returns at once, or rethrows the op's error
      if (c.matrix->dtype == DataType::float32)
        compute_q<float>(c);
      else
        compute_q<double>(c);
      c.q_handle =
          allreduce_async(c.matrix->q_wire, with_name(w.q_options, c.name + ".powersgd.q"));
    } catch (...) {
      c.error = std::current_exception();
    }
  }

  static AllreduceOptions with_name(AllreduceOptions o, std::string name) {
    o.name = std::move(name);
    return o;
  }

  template <class T>
  void compute_q(CompressedGradient& c) {
    PowerSGDMatrix& mx = *c.matrix;
    c.p = widened<T>(mx.p_wire);
    orthonormalize(c.p, mx.rows, mx.rank, options_.orthogonalization_epsilon);
    multiply_mt_p(static_cast<const T*>(c.gradient.data), mx.rows, mx.cols, mx.rank, c.p,
                  static_cast<T*>(mx.q_wire.data()));
  }

  template <class T>
  void complete(const PowerSGDWork& w, CompressedGradient& c) {
    PowerSGDMatrix& mx = *c.matrix;
    T* error = options_.error_feedback ? static_cast<T*>(mx.error.data()) : nullptr;
    decompress_into(static_cast<T*>(c.gradient.data), mx.rows, mx.cols, mx.rank, c.p,
                    static_cast<const T*>(mx.q_wire.data()), error, w.scale);
    std::lock_guard lock(mutex);
    mx.q = widened<T>(mx.q_wire);
    mx.summed = w.q_options.op == ReduceOp::Sum;
  }

  PowerSGDOptions options_;
  std::mutex progress_mutex_;  // one advance() at a time: a gradient's Q is posted once
};

class PowerSGDPending final : public PendingGradients {
 public:
  PowerSGDPending(std::shared_ptr<PowerSGDCore> core, std::shared_ptr<PowerSGDWork> work)
      : core_(std::move(core)), work_(std::move(work)) {}
  ~PowerSGDPending() override {
    try {
      core_->finish(*work_);
    } catch (...) {
      // The owner saw (or will see) the error through wait(); a destructor never throws.
    }
  }
  void wait() override { core_->finish(*work_); }

 private:
  std::shared_ptr<PowerSGDCore> core_;
  std::shared_ptr<PowerSGDWork> work_;
};

// The matrix a gradient is seen as, if PowerSGD compresses it (Note [PowerSGD]).
struct MatrixShape {
  std::int64_t rows = 0, cols = 0;
  int rank = 0;
};
inline std::optional<MatrixShape> compressed_shape(const TensorView& g, const std::string& name,
                                                   const PowerSGDOptions& o) {
  if (g.dtype != DataType::float32 && g.dtype != DataType::float64) return std::nullopt;
  if (g.shape.size() < 2) return std::nullopt;
  MatrixShape s{g.shape[0], row_numel(g.shape), 0};
  if (s.rows * s.cols != g.numel)
    throw InvalidArgumentError(
        fmt::format("dtrain: PowerSGD: gradient '{}' has shape [{}] but {} elements", name,
                    fmt::join(g.shape, ", "), g.numel));
  if (g.numel == 0) return std::nullopt;
  s.rank = static_cast<int>(std::min<std::int64_t>({s.rows, s.cols, o.rank}));
  const double rate = static_cast<double>(s.rows) * static_cast<double>(s.cols) /
                      ((static_cast<double>(s.rows) + static_cast<double>(s.cols)) * s.rank);
  if (rate < o.min_compression_rate) return std::nullopt;
  return s;
}

// start()'s first round for one gradient: error feedback, the starting Q, P = M Q, P's allreduce.
template <class T>
void post_p(CompressedGradient& c, const PowerSGDOptions& o, const GradientBucket& bucket) {
  PowerSGDMatrix& mx = *c.matrix;
  T* g = static_cast<T*>(c.gradient.data);
  if (o.error_feedback) {
    const T* e = static_cast<const T*>(mx.error.data());
    for (std::int64_t i = 0; i < mx.rows * mx.cols; ++i) g[i] += e[i];
  }
  const bool warm = o.warm_start && !mx.q.empty() && !has_zero_column(mx.q, mx.cols, mx.rank);
  std::vector<double> q =
      warm ? mx.q : powersgd_random_q(o.seed, c.name, bucket.step, mx.cols, mx.rank);
  orthonormalize(q, mx.cols, mx.rank, o.orthogonalization_epsilon);
  multiply_m_q(g, mx.rows, mx.cols, mx.rank, q, static_cast<T*>(mx.p_wire.data()));
  AllreduceOptions p_options;
  p_options.op = ReduceOp::Sum;  // P is orthonormalized next: its scale does not matter
  p_options.name = c.name + ".powersgd.p";
  p_options.process_set = bucket.options.process_set;
  c.p_handle = allreduce_async(mx.p_wire, p_options);
}

}  // namespace dtrain::detail
