#pragma once
// PowerSGD (Vogels, Karimireddy and Jaggi, NeurIPS'19): gradients sent as low-rank factors, as a
// GradientHook. c10d's powerSGD_hook is the model.
//
//   dtrain::DistributedOptimizer opt(sgd, {.hook = dtrain::powersgd_hook({.rank = 2})});
//
// Note [PowerSGD]
// Each gradient with two or more dimensions is seen as an n x m matrix M (n = shape[0], m the
// product of the rest). With Q an m x r matrix the same on every rank, one step is
//   M += e (error feedback);  P = M Q;  allreduce P (Sum);  orthonormalize P's columns;
//   Q = M^T P;  allreduce Q (the bucket's op);  M^ = P Q^T into the gradient;  e = M - M^
//   (e as Average sees it; "Scales" below)
// so n r + m r numbers travel instead of n m. Q starts as a standard normal draw seeded by
// PowerSGDOptions::seed, the gradient's name and the step (our own mt19937_64 and Box-Muller, so
// every rank draws the same numbers); with warm_start the reduced Q is the next step's start, one
// power iteration per step, else a new Q is drawn each step. A gradient whose rate
// n m / ((n + m) r) is below min_compression_rate, a 1-D one, and every gradient before
// start_step synchronizations, travel as they are.
//
// Two rounds: start() adds the errors, computes every P of the bucket and posts their allreduces
// (and the plain ones of the other gradients); wait() finishes the P round and posts the Q round.
// c10d chains these as futures. dtrain's handles have no continuations, and a continuation would
// run the products on the engine's thread, stalling every other op; so the Q round runs in the
// waiting thread. But a wait() that posted only its own bucket's Qs could deadlock: the libtorch
// optimizer waits for its buckets in the order this rank submitted them, which may differ across
// ranks, and rank 0 would wait for rank 1's Qs of bucket A while rank 1 waits in bucket B for
// rank 0's. So any wait() moves every bucket the hook has started: until each one has posted its
// Qs, it posts those whose Ps have arrived (polling, 1 ms at a time), and only then blocks on its
// own Qs. No rank then waits for a Q that another rank has left unposted while it waits.
//
// Arithmetic: products accumulate in double and orthonormalization (Gram-Schmidt, as c10d,
// dividing by norm + orthogonalization_epsilon) runs in double, since a float32 Gram-Schmidt loses
// orthogonality; P and Q travel in the gradient's dtype, which is where the bandwidth goes, and
// the error is kept in it (as c10d: one gradient's worth of memory). float32 and float64 host
// gradients are compressed. float16 and bfloat16 gradients travel as they are: already half the
// bytes, and an error kept in 16 bits would lose the small residuals error feedback exists for.
// CUDA gradients are refused: the products run on the host, for host gradients.
//
// Scales: Q's allreduce uses the bucket's op, prescale and postscale, so M^ is what allreduce of
// the approximations would give (Average divides by the contributors); the error is kept unscaled,
// e = M - M^ / s with s = prescale postscale (times the set's size for Sum), so that the sum over
// ranks of the errors is the compression's whole residual whatever the op. A column that is zero
// (a zero gradient) stays zero rather than dividing by zero; a warm Q with a zero column (last
// step's gradient was zero) is drawn afresh, since a zero Q would give zero P forever.
//
// Note [PowerSGD state in checkpoints]
// gather_state() (collective) returns a PowerSGDState to save as a shared checkpoint item;
// load_state() (not collective) takes it back on any world size. Q is the same on every rank, so
// it carries over as it is. Errors are each rank's own: on the world size that saved them, each
// rank takes its own back, and the run continues bit for bit. On another world size a rank's
// error has no owner (the sampler re-shards the data), and what matters is the residual the
// update still owes: every new rank takes the mean of the saved errors under Average (the mean
// over the new ranks is the old mean) and their sum over the new count under Sum (the sum is the
// old sum). Dropping departed ranks' errors, or giving new ranks zeros, would lose or shrink it.
// The state also holds the step: a resumed job makes a new optimizer, whose count starts at 0, so
// after load_state() the hook counts on from the saved step (start_step and the draws of Q go on
// where they were) by adding the difference to the next bucket's step and every later one.
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "dtrain/core/build_mode.hpp"
#include "dtrain/train/gradient_hook.hpp"

namespace dtrain {

struct PowerSGDOptions {
  int rank = 1;                          // columns of P and Q (c10d: matrix_approximation_rank)
  std::int64_t start_step = 1000;        // synchronizations allreduced as they are first
  double min_compression_rate = 2.0;     // compress when n m / ((n + m) rank) is at least this
  bool error_feedback = true;            // carry each step's residual into the next
  bool warm_start = true;                // start from the previous step's Q
  std::uint64_t seed = 0;                // of the random Qs, the same on every rank
  double orthogonalization_epsilon = 0;  // added to each norm in Gram-Schmidt
};

// A PowerSGDHook's state, as gather_state() returns it (Note [PowerSGD state in checkpoints]).
struct PowerSGDState {
  struct Matrix {
    std::int64_t rows = 0, cols = 0;
    std::int32_t rank = 0;                    // effective: min(rows, cols, options.rank)
    bool summed = false;                      // last reduced with Sum (else Average)
    std::vector<double> q;                    // cols x rank, row-major; empty: none yet
    std::vector<std::vector<double>> errors;  // per saving rank, rows x cols; empty: no feedback

    template <class Self>
    static auto tie_fields(Self& s) {
      return std::tie(s.rows, s.cols, s.rank, s.summed, s.q, s.errors);
    }
  };
  std::string settings;                    // the saving hook's settings()
  std::int32_t rank = 0;                   // its PowerSGDOptions::rank
  std::int64_t world_size = 0;             // ranks that saved it
  std::int64_t step = 0;                   // synchronizations the hook had seen
  std::map<std::string, Matrix> matrices;  // by gradient name

  template <class Self>
  static auto tie_fields(Self& s) {
    return std::tie(s.settings, s.rank, s.world_size, s.step, s.matrices);
  }
};

namespace detail {
class PowerSGDCore;  // train/powersgd_core.hpp
}  // namespace detail

class PowerSGDHook final : public GradientHook {
 public:
  // Throws InvalidArgumentError naming the first invalid option.
  DTRAIN_API explicit PowerSGDHook(PowerSGDOptions options = {});
  DTRAIN_API ~PowerSGDHook() override;

  DTRAIN_API std::unique_ptr<PendingGradients> start(GradientBucket bucket) override;
  // Every option: ranks whose settings differ fail together (Note [Gradient communication hooks]).
  DTRAIN_API std::string settings() const override;
  const PowerSGDOptions& options() const noexcept { return options_; }

  // Collective over the world: every rank's errors and the Qs. Call with no bucket in flight (after
  // the optimizer's step()), on every rank.
  DTRAIN_API PowerSGDState gather_state();
  // Not collective: replaces the state with `state`, on any world size; gradients take theirs at
  // their next step. Throws if it was saved with another rank, or if a bucket is in flight.
  DTRAIN_API void load_state(const PowerSGDState& state);

 private:
  PowerSGDOptions options_;
  std::shared_ptr<detail::PowerSGDCore> core_;  // shared with the buckets in flight
};

DTRAIN_API std::shared_ptr<PowerSGDHook> powersgd_hook(PowerSGDOptions options = {});

}  // namespace dtrain

#ifdef DTRAIN_HEADER_ONLY
#include "dtrain/train/powersgd_impl.hpp"
#endif
