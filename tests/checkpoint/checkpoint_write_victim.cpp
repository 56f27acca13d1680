// A process killed while rank 0 writes a checkpoint (SIGKILL, no chance to clean up), and the
// process after it. Driven by atomic_kill.sh:
//   checkpoint_write_victim write DIR    saves step 1 and waits for it, starts saving a large
//                                        step 2 and kills itself once the temporary file is
//                                        partly written (exit 3: the write finished first)
//   checkpoint_write_victim verify DIR   restores: must be step 1, intact (exit 0, else 1)
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "dtrain/dtrain.hpp"

namespace {

const std::vector<std::int64_t> kSmall{1, 2, 3};

int write(const std::filesystem::path& dir) {
  dtrain::Checkpoint c({.directory = dir, .keep_last = 3});
  c.save({.step = 1}, {{"value", kSmall}});
  c.wait();
  const std::vector<float> large(std::size_t{24} << 20, 0.5f);  // 96 MiB: written in 4 MiB pieces
  c.save({.step = 2}, {{"value", large}});
  const auto temporary = dir / fmt::format(".checkpoint-{:012}.dtrain.tmp-{}", 2, ::getpid());
  const auto final_file = dir / "checkpoint-000000000002.dtrain";
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < deadline) {
    struct stat st {};
    if (::stat(temporary.c_str(), &st) == 0 && st.st_size > 0) {
      std::printf("killing the writer with %lld bytes of %s written\n",
                  static_cast<long long>(st.st_size), temporary.filename().c_str());
      std::fflush(stdout);
      std::raise(SIGKILL);
    }
    if (std::filesystem::exists(final_file)) {
      std::printf("the write finished before it could be interrupted\n");
      return 3;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  std::printf("the temporary file never appeared\n");
  return 1;
}

int verify(const std::filesystem::path& dir) {
  dtrain::Checkpoint c({.directory = dir, .keep_last = 3});
  const auto restored = c.restore();
  if (!restored) {
    std::printf("no valid checkpoint left\n");
    return 1;
  }
  const auto value = restored->get<std::vector<std::int64_t>>("value");
  std::printf("restored step %lld, %zu values\n", static_cast<long long>(restored->step()),
              value.size());
  if (restored->step() != 1 || value != kSmall) return 1;
  for (const auto& entry : std::filesystem::directory_iterator(dir))
    if (entry.path().filename().string().find(".tmp-") != std::string::npos) {
      std::printf("a temporary file is still there: %s\n", entry.path().c_str());
      return 1;
    }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  dtrain::Session session(argc, argv);
  if (argc != 3) {
    std::fprintf(stderr, "usage: checkpoint_write_victim write|verify DIR\n");
    return 2;
  }
  const std::string_view mode = argv[1];
  if (mode == "write") return write(argv[2]);
  if (mode == "verify") return verify(argv[2]);
  return 2;
}
