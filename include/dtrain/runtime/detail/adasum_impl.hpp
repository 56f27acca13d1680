#pragma once
// allreduce and grouped_allreduce with ReduceOp::Adasum: the tree of Note [Adasum tree]
// (runtime/detail/adasum_tree.hpp), run as a sequence of the engine's own alltoalls and one
// allgather, so negotiation by name, cross-rank errors, timeouts and process sets are the engine's.
// Part of the compiled collectives (runtime/detail/collectives_impl.hpp includes it).
#include <algorithm>
#include <bit>
#include <cstring>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "dtrain/comm/local_reduce.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/runtime/detail/adasum_buffers.hpp"
#include "dtrain/runtime/detail/adasum_tree.hpp"
#include "dtrain/runtime/detail/adasum_worker.hpp"
#include "dtrain/runtime/detail/collectives_impl.hpp"
#include "dtrain/runtime/engine/engine.hpp"

namespace dtrain::detail {

// The names of the Adasum ops in flight on this rank, by process set. Their exchanges are named
// after them, so a second op of the same name would pair its exchanges with the first one's.
class AdasumNames {
 public:
  void claim(std::int32_t set, const std::string& name, int rank) {
    std::lock_guard lock(mutex_);
    if (!names_.emplace(set, name).second)
      throw InvalidArgumentError(fmt::format(
          "dtrain: an op named '{}' is already in flight on rank {}{}: names must be unique "
          "among in-flight ops (wait for the first one, or give the second a different name)",
          name, rank, set == 0 ? std::string() : fmt::format(" on process set {}", set)));
  }
  void release(std::int32_t set, const std::string& name) {
    std::lock_guard lock(mutex_);
    names_.erase({set, name});
  }

 private:
  std::mutex mutex_;
  std::set<std::pair<std::int32_t, std::string>> names_;
};

inline AdasumNames& adasum_names() {
  static AdasumNames names;
  return names;
}

// What each member says about its op before any vector is combined; every member compares them
// all and so reaches the same verdict.
struct AdasumDescription {
  int member = -1;  // place in the set
  double prescale = 1.0, postscale = 1.0;
  std::vector<DataType> dtypes;
  std::vector<Shape> shapes;
};

// As int64 words: [length, member, prescale bits, postscale bits, tensors, then per tensor
// dtype, rank, dims...]. The length leads so the allgathered blocks can be walked.
inline std::vector<std::int64_t> encode(const AdasumDescription& d) {
  std::vector<std::int64_t> w{0, d.member, std::bit_cast<std::int64_t>(d.prescale),
                              std::bit_cast<std::int64_t>(d.postscale),
                              static_cast<std::int64_t>(d.dtypes.size())};
  for (std::size_t i = 0; i < d.dtypes.size(); ++i) {
    w.push_back(static_cast<std::int64_t>(d.dtypes[i]));
    w.push_back(static_cast<std::int64_t>(d.shapes[i].size()));
    w.insert(w.end(), d.shapes[i].begin(), d.shapes[i].end());
  }
  w[0] = static_cast<std::int64_t>(w.size());
  return w;
}

// The blocks of an allgather of encode()'s words, by member; a member that joined gave none.
inline std::vector<std::optional<AdasumDescription>> decode_all(const std::vector<std::int64_t>& w,
                                                                int members) {
  std::vector<std::optional<AdasumDescription>> out(static_cast<std::size_t>(members));
  const auto malformed = [] {
    return Error("dtrain: internal error: malformed Adasum description from a peer");
  };
  for (std::size_t at = 0; at < w.size();) {
    const std::int64_t length = w[at];
    if (length < 5 || static_cast<std::size_t>(length) > w.size() - at) throw malformed();
    const std::size_t end = at + static_cast<std::size_t>(length);
    AdasumDescription d;
    d.member = static_cast<int>(w[at + 1]);
    d.prescale = std::bit_cast<double>(w[at + 2]);
    d.postscale = std::bit_cast<double>(w[at + 3]);
    std::size_t i = at + 5;
    for (std::int64_t t = 0; t < w[at + 4]; ++t) {
      if (i + 2 > end) throw malformed();
      d.dtypes.push_back(static_cast<DataType>(w[i]));
      const auto rank = static_cast<std::size_t>(w[i + 1]);
      if (rank > end - i - 2) throw malformed();
      d.shapes.emplace_back(w.begin() + static_cast<std::ptrdiff_t>(i + 2),
                            w.begin() + static_cast<std::ptrdiff_t>(i + 2 + rank));
      i += 2 + rank;
    }
    if (d.member < 0 || d.member >= members) throw malformed();
    out[static_cast<std::size_t>(d.member)] = std::move(d);
    at = end;
  }
  return out;
}

// One Adasum allreduce in flight (Note [Adasum tree]): its tensors, the vector it sends (all of
// them, placed by adasum_layout), and its place in the schedule. Steps run on the worker thread;
// completions only hand the op to it.
class AdasumOp : public std::enable_shared_from_this<AdasumOp> {
 public:
  AdasumOp(NamedOp op, std::vector<TensorView> tensors, const AllreduceOptions& options,
           bool grouped)
      : op_(std::move(op)), tensors_(std::move(tensors)), grouped_(grouped),
        prescale_(options.prescale), postscale_(options.postscale),
        layout_(adasum_layout(tensors_)), done_(make_op_state()) {
    const auto& ranks = *op_.set.ranks;
    members_ = static_cast<int>(ranks.size());
    me_ = static_cast<int>(std::lower_bound(ranks.begin(), ranks.end(), op_.engine->rank()) -
                           ranks.begin());
    steps_ = adasum_schedule(members_, me_);
  }
  AdasumOp(const AdasumOp&) = delete;
  AdasumOp& operator=(const AdasumOp&) = delete;
  ~AdasumOp() {
    if (!buffers_) return;
    buffers_->give_back(std::move(mine_));
    buffers_->give_back(std::move(theirs_));
  }

  // Submits the description and the first exchange; returns the op's state.
  std::shared_ptr<OpState> start() {
    if (steps_.empty()) {  // one member: its vector is the result
      for (const auto& t : tensors_) {
        scale_in_place(t.dtype, t.data, t.numel, prescale_);
        scale_in_place(t.dtype, t.data, t.numel, postscale_);
      }
      op_complete(*done_);
      return done_;
    }
    worker_ = adasum_worker();
    buffers_ = adasum_buffers();
    mine_ = buffers_->take(layout_.bytes);
    theirs_ = buffers_->take(layout_.bytes);
    for (std::size_t i = 0; i < tensors_.size(); ++i) {
      std::byte* at = mine_.data.get() + layout_.offsets[i];
      scale_copy(tensors_[i].dtype, tensors_[i].data, at, tensors_[i].numel, prescale_);
      const std::int64_t end = i + 1 < tensors_.size() ? layout_.offsets[i + 1] : layout_.bytes;
      std::memset(at + tensors_[i].nbytes(), 0,  // the padding travels too
                  static_cast<std::size_t>(end - layout_.offsets[i] - tensors_[i].nbytes()));
    }
    AdasumDescription mine{me_, prescale_, postscale_, {}, {}};
    for (const auto& t : tensors_) {
      mine.dtypes.push_back(t.dtype);
      mine.shapes.push_back(t.shape);
    }
    description_ = encode(mine);

    adasum_names().claim(op_.set.id, op_.name, op_.engine->rank());
    std::vector<std::shared_ptr<Entry>> first;
    first.push_back(description_entry());
    first.push_back(exchange_entry(steps_.front()));
    pending_ = 2;
    auto done = done_;  // from here on the worker may finish the op, and finish() takes done_
    try {
      submit_all(*op_.engine, std::move(first));
    } catch (...) {
      adasum_names().release(op_.set.id, op_.name);
      throw;
    }
    return done;
  }

 private:
  std::string step_name(std::string_view label) const {
    return fmt::format("{}.adasum.{}", op_.name, label);
  }
  Request step_request(std::string_view label, OpKind kind, DataType dtype,
                       std::int64_t rows) const {
    Request q;
    q.name = step_name(label);
    q.kind = kind;
    q.process_set = op_.set.id;
    q.dtype = dtype;
    q.shape = {rows};
    return q;
  }

  std::shared_ptr<Entry> description_entry() {
    auto e = new_entry(step_request("meta", OpKind::allgather, DataType::int64,
                                    static_cast<std::int64_t>(description_.size())));
    e->input = description_.data();
    e->make_output = [self = shared_from_this()](const Shape& s) -> void* {
      self->gathered_.resize(static_cast<std::size_t>(s.at(0)));
      return self->gathered_.data();
    };
    e->state->then = [self = shared_from_this()](std::exception_ptr error) {
      self->arrived(std::move(error), /*description=*/true);
    };
    return e;
  }

  std::shared_ptr<Entry> exchange_entry(const AdasumStep& step) {
    const std::int64_t bytes = step.send_to >= 0 ? layout_.bytes : 0;
    auto e = new_entry(step_request(step.label, OpKind::alltoall, DataType::uint8, bytes));
    e->input = bytes > 0 ? mine_.data.get() : nullptr;
    e->splits.assign(static_cast<std::size_t>(members_), 0);
    if (step.send_to >= 0) e->splits[static_cast<std::size_t>(step.send_to)] = bytes;
    e->make_output = [self = shared_from_this()](const Shape& s) -> void* {
      self->received_bytes_ = s.at(0);
      if (self->received_bytes_ > self->theirs_.capacity) {  // only where the members disagree
        self->buffers_->give_back(std::move(self->theirs_));
        self->theirs_ = self->buffers_->take(self->received_bytes_);
      }
      return self->theirs_.data.get();
    };
    e->set_received_splits = [](std::vector<std::int64_t>) {};  // the backend calls it; apply()
                                                                 // checks the size instead
    e->state->then = [self = shared_from_this()](std::exception_ptr error) {
      self->arrived(std::move(error), /*description=*/false);
    };
    return e;
  }

  // A step's op completed (engine thread): the last one of the step hands the op to the worker.
  void arrived(std::exception_ptr error, bool description) {
    bool last;
    {
      std::lock_guard lock(mutex_);
      if (error) (description ? description_error_ : exchange_error_) = std::move(error);
      last = --pending_ == 0;
    }
    if (last) worker_->post([self = shared_from_this()] { self->advance(); });
  }

  // On the worker thread: applies the exchange that completed, then submits the next or finishes.
  void advance() noexcept {
    try {
      if (step_ == 0) check_descriptions();
      if (exchange_error_) std::rethrow_exception(exchange_error_);
      apply(steps_[step_]);
      if (++step_ < steps_.size()) {
        pending_ = 1;
        submit(*op_.engine, exchange_entry(steps_[step_]));
        return;
      }
      for (std::size_t i = 0; i < tensors_.size(); ++i)
        scale_copy(tensors_[i].dtype, mine_.data.get() + layout_.offsets[i], tensors_[i].data,
                   tensors_[i].numel, postscale_);
      finish(nullptr);
    } catch (...) {
      finish(std::current_exception());
    }
  }

  void apply(const AdasumStep& step) {
    if (step.then == AdasumAction::none) return;
    if (received_bytes_ != layout_.bytes)
      throw Error(fmt::format("dtrain: internal error: allreduce '{}' (ReduceOp::Adasum): {} "
                              "bytes arrived from rank {} at step '{}', {} expected",
                              op_.name, received_bytes_, (*op_.set.ranks)[step.receive_from],
                              step.label, layout_.bytes));
    if (step.then == AdasumAction::take) std::swap(mine_, theirs_);
    else
      adasum_combine_all(tensors_, layout_, mine_.data.get(), theirs_.data.get(), step.mine_is_a);
  }

  // The verdict on the members' descriptions, the same on every member since each has them all.
  void check_descriptions() const {
    if (description_error_) std::rethrow_exception(description_error_);
    const auto& ranks = *op_.set.ranks;
    const std::string on_set =
        op_.set.id == 0 ? std::string()
                        : fmt::format(" on process set {} (ranks [{}])", op_.set.id,
                                      fmt::join(ranks, ", "));
    const auto all = decode_all(gathered_, members_);
    std::vector<int> joined;
    for (int m = 0; m < members_; ++m)
      if (!all[static_cast<std::size_t>(m)]) joined.push_back(ranks[static_cast<std::size_t>(m)]);
    if (!joined.empty())
      throw InvalidArgumentError(fmt::format(
          "dtrain: allreduce '{}'{} with ReduceOp::Adasum cannot run while ranks [{}] have "
          "joined: Adasum pairs every member's vector with another's, and a joined rank has none",
          op_.name, on_set, fmt::join(joined, ", ")));
    // Each field in turn: the first on which members differ names every value with its ranks.
    auto compare = [&](std::string_view field, auto&& text) {
      std::map<std::string, std::vector<int>> by_value;
      for (int m = 0; m < members_; ++m)
        by_value[text(*all[static_cast<std::size_t>(m)])].push_back(
            ranks[static_cast<std::size_t>(m)]);
      if (by_value.size() <= 1) return;
      std::string values;
      for (const auto& [value, rs] : by_value)
        values += fmt::format("{}{} on ranks [{}]", values.empty() ? "" : "; ", value,
                              fmt::join(rs, ", "));
      throw MismatchError(fmt::format("dtrain: ranks disagree on the {} of {}allreduce '{}'{} "
                                      "with ReduceOp::Adasum: {}",
                                      field, grouped_ ? "grouped_" : "", op_.name, on_set,
                                      values));
    };
    compare("number of tensors", [](const AdasumDescription& d) {
      return std::to_string(d.dtypes.size());
    });
    for (std::size_t i = 0; i < tensors_.size(); ++i) {
      const std::string tensor = grouped_ ? fmt::format("tensor '{}.{}'", op_.name, i)
                                          : std::string("tensor");
      compare(fmt::format("dtype of the {}", tensor),
              [&](const AdasumDescription& d) { return fmt::format("{}", d.dtypes[i]); });
      compare(fmt::format("shape of the {}", tensor), [&](const AdasumDescription& d) {
        return fmt::format("[{}]", fmt::join(d.shapes[i], ", "));
      });
    }
    compare("prescale factor",
            [](const AdasumDescription& d) { return fmt::format("{}", d.prescale); });
    compare("postscale factor",
            [](const AdasumDescription& d) { return fmt::format("{}", d.postscale); });
  }

  // Lets go of what the caller sees (the state and its error): the engine may hold this op a
  // while longer. Not of the buffers: after a timeout, the engine may still be using them.
  void finish(std::exception_ptr error) noexcept {
    adasum_names().release(op_.set.id, op_.name);
    description_error_ = exchange_error_ = nullptr;
    const auto done = std::move(done_);
    op_complete(*done, std::move(error));
  }

  NamedOp op_;
  std::vector<TensorView> tensors_;
  bool grouped_;
  double prescale_, postscale_;
  AdasumLayout layout_;
  std::shared_ptr<OpState> done_;
  std::shared_ptr<AdasumWorker> worker_;
  int members_ = 1, me_ = 0;
  std::vector<AdasumStep> steps_;
  std::size_t step_ = 0;
  std::shared_ptr<AdasumBufferPool> buffers_;
  AdasumBuffer mine_;                // this member's vector, then the result
  AdasumBuffer theirs_;              // what the last exchange brought (engine thread writes it)
  std::int64_t received_bytes_ = 0;
  std::vector<std::int64_t> description_, gathered_;

  std::mutex mutex_;  // guards the three below, which completions write on the engine thread
  int pending_ = 0;   // ops of the current step not yet completed
  std::exception_ptr description_error_, exchange_error_;
};

// Reads and checks every tensor of `op` as an Adasum allreduce. A tensor the checks refuse rejects
// the op's first two steps, the ones its peers wait in (Note [Failed ops]), then rethrows.
inline Handle submit_adasum(const NamedOp& op, const std::vector<TensorSource>& sources,
                            const AllreduceOptions& options, bool grouped) {
  std::vector<TensorView> tensors;
  try {
    for (std::size_t i = 0; i < sources.size(); ++i) {
      TensorView t = sources[i].read();
      Request q = reduction(describe(t, op, grouped ? fmt::format("{}.{}", op.name, i) : ""),
                            options);
      t.shape = q.shape;
      tensors.push_back(std::move(t));
    }
  } catch (const InvalidArgumentError& e) {
    const int members = static_cast<int>(op.set.ranks->size());
    if (members > 1) {
      const std::string first = adasum_schedule(members, 0).front().label;  // every member's
      reject(*op.engine, op.name + ".adasum.meta", OpKind::allgather, e.what(), "", op.set.id);
      reject(*op.engine, fmt::format("{}.adasum.{}", op.name, first), OpKind::alltoall, e.what(),
             "", op.set.id);
    }
    throw;
  }
  auto adasum = std::make_shared<AdasumOp>(op, std::move(tensors), options, grouped);
  return Handle(adasum->start());
}

}  // namespace dtrain::detail
