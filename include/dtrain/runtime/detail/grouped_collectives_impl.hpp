#pragma once
// The compiled part of the grouped collectives (Note [Compiled submission] in
// runtime/collectives.hpp): a group is submitted all or nothing.
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "dtrain/runtime/detail/collectives_impl.hpp"
#include "dtrain/runtime/grouped_collectives.hpp"

namespace dtrain::detail {

// Submits group `op` of `count` members, all or nothing: member i's tensor (`source(i)`) is read
// within the group's checks and described under the name "<group>.<i>", `more` adds the op's own
// checks to its request (they reject the whole group), `attach(i, tensor, entry)` gives its entry
// its memory. Returns the group's state: done when the last member is, with the first member's
// error.
template <class Source, class More, class Attach>
std::shared_ptr<OpState> submit_group(const NamedOp& op, std::int32_t count, Source&& source,
                                      More&& more, Attach&& attach) {
  const std::string& group = op.name;
  NamedOp rejecting = op;
  rejecting.name = group + ".rejected";
  rejecting.group = group;
  std::vector<std::shared_ptr<Entry>> entries;
  for (std::int32_t i = 0; i < count; ++i) {
    TensorView t;
    Request q = checked(rejecting, [&] {
      t = source(i).read();
      return more(describe(t, op, fmt::format("{}.{}", group, i)));
    });
    q.group = group;
    q.group_size = count;
    auto e = new_entry(std::move(q));
    attach(i, t, *e);
    entries.push_back(std::move(e));
  }
  if (count == 0) {
    // An empty group still takes part, so a rank whose group is not empty is told they differ.
    NamedOp stand_in = op;
    stand_in.kind = OpKind::barrier;
    Request q = bare_request(stand_in, group + ".empty");
    q.group = group;
    q.group_size = 0;
    entries.push_back(new_entry(std::move(q)));
  }
  std::vector<std::shared_ptr<OpState>> states;
  for (const auto& e : entries) states.push_back(e->state);
  auto all = complete_together(states);
  submit_all(*op.engine, std::move(entries));
  return all;
}

DTRAIN_API Handle submit_grouped_allreduce(std::vector<TensorSource> members,
                                           const AllreduceOptions& options) {
  const auto op =
      name_op(options.name, OpKind::allreduce, "grouped_allreduce", options.process_set);
  if (options.op == ReduceOp::Adasum) return submit_adasum(op, members, options, true);
  return Handle(submit_group(
      op, static_cast<std::int32_t>(members.size()),
      [&](std::int32_t i) -> const TensorSource& { return members[static_cast<std::size_t>(i)]; },
      [&](Request q) { return reduction(std::move(q), options); },
      [](std::int32_t, const TensorView& t, Entry& e) { in_place(t)(e); }));
}

// A group whose members each return a new tensor: member i's output is made by its OutputMaker.
template <class More>
std::shared_ptr<OpState> submit_group_with_outputs(const NamedOp& op,
                                                   std::vector<GroupMember>& members,
                                                   More&& more) {
  return submit_group(
      op, static_cast<std::int32_t>(members.size()),
      [&](std::int32_t i) -> const TensorSource& {
        return members[static_cast<std::size_t>(i)].tensor;
      },
      more,
      [&](std::int32_t i, const TensorView& t, Entry& e) {
        with_output(t, members[static_cast<std::size_t>(i)].make_output)(e);
      });
}

DTRAIN_API std::shared_ptr<OpState> submit_grouped_allgather(std::vector<GroupMember> members,
                                                             const CollectiveOptions& options) {
  const auto op =
      name_op(options.name, OpKind::allgather, "grouped_allgather", options.process_set);
  return submit_group_with_outputs(op, members, no_more_checks);
}

DTRAIN_API std::shared_ptr<OpState> submit_grouped_reducescatter(
    std::vector<GroupMember> members, const ReducescatterOptions& options) {
  const auto op = name_op(options.name, OpKind::reducescatter, "grouped_reducescatter",
                          options.process_set);
  return submit_group_with_outputs(
      op, members, [&](Request q) { return reduction(std::move(q), options); });
}

}  // namespace dtrain::detail
