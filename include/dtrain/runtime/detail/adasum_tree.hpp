#pragma once
// The Adasum reduction's arithmetic and its fixed tree of exchanges: pure functions of the vectors
// and of the set's size, shared by the op (runtime/detail/adasum_impl.hpp) and nothing else.
//
// Note [Adasum tree]
// Adasum (Maleki et al., "Adaptive summation", MLSys'21; Horovod's hvd.Adasum) combines two
// gradients a and b as
//   adasum(a, b) = (1 - a·b / 2|a|²) a + (1 - a·b / 2|b|²) b,
// which is a + b for orthogonal vectors and a for a == b. Each tensor of an op is combined on its
// own: the dot product and norms are those of one tensor, never of a fused buffer. As in Horovod
// (horovod/common/ops/adasum/adasum.h), the dot product and squared norms are accumulated in
// double (here in four interleaved partial sums, as Horovod's AVX path does; its plain loop uses
// one), each element is formed in double and rounded once to the element type, and a side whose
// squared norm is below sqrt(DBL_MIN) counts as zero: its coefficient stays 1, so adasum(a, 0) = a
// and adasum(0, 0) = 0.
//
// The operator is not associative, so the result depends on how the vectors are paired. dtrain
// fixes the pairing from the set's size alone. Over the N members (numbered by their place in the
// set) and p, the largest power of two <= N:
//   fold     (N > p only): member r + p sends its vector to member r (r < N - p), which keeps
//            adasum(v_r, v_{r+p});
//   level k  (k = 0 .. log2(p) - 1): members r and r ^ 2^k, both below p, swap vectors and both
//            keep adasum(lower member's, higher member's);
//   unfold   (N > p only): member r sends the result to member r + p.
// After level k each member below p holds the combination of its block of 2^(k+1) vectors, which
// both partners computed with the same operations on the same operands (the lower member's vector
// is always `a`), so every member ends with bitwise the same result: for N = 4,
// adasum(adasum(v0, v1), adasum(v2, v3)); for N = 3, adasum(adasum(v0, v2), v1). Folding the
// members past p into the first ones, rather than refusing (as Horovod does) or padding the tree
// with zero vectors, keeps every level a plain pairwise exchange.
//
// Each exchange is one alltoall of the set whose only non-empty split goes to the partner, named
// "<op>.adasum.fold", "<op>.adasum.<k>", "<op>.adasum.unfold"; the first is submitted with an
// allgather "<op>.adasum.meta" of each member's description (tensor count, dtypes, shapes, scale
// factors), so ranks that disagree fail with a MismatchError naming them, on every rank, before
// any vector is combined. Negotiation, timeouts, stall warnings and process sets apply to these
// ops unchanged. The later steps of every Adasum op in flight run on one worker thread of the
// process (runtime/detail/adasum_worker.hpp), which submits each step when the previous one has
// completed and never waits for a peer: ops submitted in different orders on different ranks, or
// from several threads, cannot hold each other up.
//
// Cost: every level moves the whole vector, log2(p) times its bytes per member (two more exchanges
// when N > p). Horovod's CPU Adasum halves the vector at each level instead (vector halving,
// distance doubling: about twice the bytes in all, plus an allreduce of partial dot products per
// level among the ranks that share a slice); that variant is not built, nor is a device path:
// Adasum runs on host float32 and float64 tensors only.
#include <cfloat>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "dtrain/tensor/view.hpp"

namespace dtrain::detail {

// adasum(a, b) of n elements into `out`, which may be a or b (Note [Adasum tree]). The sums run
// in kAdasumLanes interleaved partial sums, element i in lane i % kAdasumLanes, added up in a
// fixed order: one chain of dependent additions would leave the core waiting on each (about 4x
// slower), and a fixed order keeps the bits the same on both partners.
inline constexpr int kAdasumLanes = 4;

template <class T>
void adasum_combine(const T* a, const T* b, T* out, std::int64_t n) noexcept {
  double dot[kAdasumLanes] = {}, a_sq[kAdasumLanes] = {}, b_sq[kAdasumLanes] = {};
  auto add = [&](std::int64_t i, int k) {
    const double x = static_cast<double>(a[i]), y = static_cast<double>(b[i]);
    dot[k] += x * y;
    a_sq[k] += x * x;
    b_sq[k] += y * y;
  };
  const std::int64_t whole = n - n % kAdasumLanes;
  for (std::int64_t i = 0; i < whole; i += kAdasumLanes)
    for (int k = 0; k < kAdasumLanes; ++k) add(i + k, k);
  for (std::int64_t i = whole; i < n; ++i) add(i, static_cast<int>(i - whole));
  auto total = [](const double* s) { return (s[0] + s[1]) + (s[2] + s[3]); };
  static_assert(kAdasumLanes == 4, "total() adds four lanes");
  const double dot_all = total(dot), a_sq_all = total(a_sq), b_sq_all = total(b_sq);
  // Horovod's threshold: below it the norm is noise, and dividing by it would blow up.
  const double tiny = std::sqrt(DBL_MIN);
  const double a_coeff = a_sq_all >= tiny ? 1.0 - dot_all / a_sq_all * 0.5 : 1.0;
  const double b_coeff = b_sq_all >= tiny ? 1.0 - dot_all / b_sq_all * 0.5 : 1.0;
  for (std::int64_t i = 0; i < n; ++i)
    out[i] = static_cast<T>(a_coeff * static_cast<double>(a[i]) +
                            b_coeff * static_cast<double>(b[i]));
}

// Where each tensor of an op lies in the buffer its vector travels in: tensor i at offsets[i],
// each at a multiple of 8 bytes so a float64 tensor after a float32 one stays aligned.
struct AdasumLayout {
  std::vector<std::int64_t> offsets;
  std::int64_t bytes = 0;
};

inline AdasumLayout adasum_layout(const std::vector<TensorView>& tensors) {
  AdasumLayout out;
  for (const auto& t : tensors) {
    out.offsets.push_back(out.bytes);
    out.bytes += (t.nbytes() + 7) / 8 * 8;
  }
  return out;
}

// Combines every tensor of `mine` with its counterpart in `theirs`, in place in `mine`: `mine`
// is adasum's a where `mine_is_a`, else b. Tensors are float32 or float64 (checked on submission).
inline void adasum_combine_all(const std::vector<TensorView>& tensors, const AdasumLayout& layout,
                               std::byte* mine, const std::byte* theirs, bool mine_is_a) {
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const auto at = static_cast<std::size_t>(layout.offsets[i]);
    auto combine = [&](auto* m) {
      using T = std::remove_pointer_t<decltype(m)>;
      const T* t = reinterpret_cast<const T*>(theirs + at);
      if (mine_is_a) adasum_combine(m, t, m, tensors[i].numel);
      else adasum_combine(t, m, m, tensors[i].numel);
    };
    if (tensors[i].dtype == DataType::float64) combine(reinterpret_cast<double*>(mine + at));
    else combine(reinterpret_cast<float*>(mine + at));
  }
}

// What a member does after one exchange of the tree.
enum class AdasumAction : std::uint8_t { none, combine, take };

// One exchange of the tree as one member sees it.
struct AdasumStep {
  std::string label;       // the exchange's name is "<op>.adasum.<label>"
  int send_to = -1;        // the member that receives this member's vector, or -1
  int receive_from = -1;   // the member whose vector arrives here, or -1
  AdasumAction then = AdasumAction::none;
  bool mine_is_a = true;   // combine: this member's vector is adasum's a (it is the lower member)
};

inline int largest_power_of_two_at_most(int n) {
  int p = 1;
  while (p <= n / 2) p *= 2;
  return p;
}

// The exchanges of member `me` of a set of `members` (Note [Adasum tree]); none for one member.
inline std::vector<AdasumStep> adasum_schedule(int members, int me) {
  std::vector<AdasumStep> steps;
  if (members <= 1) return steps;
  const int p = largest_power_of_two_at_most(members);
  const int extra = members - p;
  if (extra > 0) {
    AdasumStep fold{.label = "fold"};
    if (me >= p) {
      fold.send_to = me - p;
    } else if (me < extra) {
      fold.receive_from = me + p;
      fold.then = AdasumAction::combine;
    }
    steps.push_back(fold);
  }
  for (int level = 0; (1 << level) < p; ++level) {
    AdasumStep s{.label = std::to_string(level)};
    if (me < p) {
      const int partner = me ^ (1 << level);
      s.send_to = s.receive_from = partner;
      s.then = AdasumAction::combine;
      s.mine_is_a = me < partner;
    }
    steps.push_back(s);
  }
  if (extra > 0) {
    AdasumStep unfold{.label = "unfold"};
    if (me < extra) {
      unfold.send_to = me + p;
    } else if (me >= p) {
      unfold.receive_from = me - p;
      unfold.then = AdasumAction::take;
    }
    steps.push_back(unfold);
  }
  return steps;
}

}  // namespace dtrain::detail
