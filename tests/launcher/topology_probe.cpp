// Test program for the launcher tests: one JSON line per rank with its place in the job (world,
// local and cross ranks, host name), then an allreduce checked element by element against its
// closed form, then one JSON line with the verdict and how many collectives ran hierarchically
// and over Gloo.
//
//   topology_probe [--elements N] [--exit-rank R --exit-code C]
//
// With --exit-rank, rank R exits with code C right after init (no shutdown, like a crash) while
// the others wait in the allreduce: the launcher must report R's code, not the fallout.
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "dtrain/dtrain.hpp"

namespace {

struct Args {
  std::int64_t elements = 1 << 20;
  int exit_rank = -1;
  int exit_code = 0;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string_view flag = argv[i];
    const long long value = std::strtoll(argv[i + 1], nullptr, 10);
    if (flag == "--elements") a.elements = value;
    else if (flag == "--exit-rank") a.exit_rank = static_cast<int>(value);
    else if (flag == "--exit-code") a.exit_code = static_cast<int>(value);
  }
  return a;
}

std::string host_name() {
  char name[256] = {};
  gethostname(name, sizeof(name) - 1);
  return name;
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse(argc, argv);
  dtrain::init(argc, argv);
  const int rank = dtrain::rank(), size = dtrain::size();
  const char* host_id = std::getenv("DTRAIN_HOST_ID");
  fmt::print("{{\"probe\": \"topology\", \"rank\": {}, \"size\": {}, \"local_rank\": {}, "
             "\"local_size\": {}, \"cross_rank\": {}, \"cross_size\": {}, \"host\": \"{}\", "
             "\"host_id\": \"{}\"}}\n",
             rank, size, dtrain::local_rank(), dtrain::local_size(), dtrain::cross_rank(),
             dtrain::cross_size(), host_name(), host_id != nullptr ? host_id : "");
  std::fflush(stdout);
  if (rank == args.exit_rank) std::_Exit(args.exit_code);

  // Element i of rank r holds r + i % 7, so the sum over ranks is size(size-1)/2 + size(i % 7):
  // small integers, exact in float whatever the order of the additions.
  std::vector<float> data(static_cast<std::size_t>(args.elements));
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<float>(rank + i % 7);
  dtrain::allreduce(data, {.op = dtrain::ReduceOp::Sum, .name = "probe"});
  std::int64_t wrong = 0;
  for (std::size_t i = 0; i < data.size(); ++i) {
    const float expected = static_cast<float>(size * (size - 1) / 2 + size * (i % 7));
    wrong += data[i] != expected;
  }
  fmt::print("{{\"probe\": \"allreduce\", \"rank\": {}, \"elements\": {}, \"wrong\": {}, "
             "\"hierarchical_collectives\": {}, \"gloo_collectives\": {}}}\n",
             rank, args.elements, wrong, dtrain::engine_stats().hierarchical_collectives,
             dtrain::engine_stats().gloo_collectives);
  std::fflush(stdout);
  dtrain::shutdown();
  return wrong == 0 ? 0 : 1;
}
