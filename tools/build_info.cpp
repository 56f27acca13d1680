// dtrain-build-info: what this dtrain installation was built with. `dtrainrun --check-build`
// runs it.
//
// Note [Build info from a program]
// dtrain is header-only, so "what dtrain was built with" is what a program compiled against the
// installed headers and the package's MPI gets: only a compiled program can say which MPI library
// it loads (MPI_Get_library_version) and which MPI headers it saw. This one is compiled with the
// package, like any consumer, and installed beside dtrainrun. It reads the CUDA and NCCL versions
// from the headers the package was configured with, and looks for a loadable NCCL with dlopen
// rather than linking it: the program must run on hosts without a GPU driver, where a linked CUDA
// or NCCL would stop it from starting at all.
#include <cctype>
#include <cstdio>
#include <string>

#include <fmt/format.h>

#include "dtrain/dtrain.hpp"

#if defined(DTRAIN_BUILD_INFO_CUDA)
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <nccl.h>
#endif

namespace {

#if defined(DTRAIN_BUILD_INFO_CUDA)
std::string nccl_code_text(int code) {
  // NCCL_VERSION(): X*1000 + Y*100 + Z up to 2.8, X*10000 + Y*100 + Z from 2.9.
  if (code < 10000) return fmt::format("{}.{}.{}", code / 1000, (code / 100) % 10, code % 100);
  return fmt::format("{}.{}.{}", code / 10000, (code / 100) % 100, code % 100);
}

std::string loadable_nccl() {
  void* library = dlopen("libnccl.so.2", RTLD_LAZY | RTLD_LOCAL);
  if (library == nullptr) return fmt::format("libnccl.so.2 cannot be loaded here ({})", dlerror());
  using GetVersion = ncclResult_t (*)(int*);
  auto get_version = reinterpret_cast<GetVersion>(dlsym(library, "ncclGetVersion"));
  int code = 0;
  std::string text = get_version != nullptr && get_version(&code) == ncclSuccess
                         ? fmt::format("libnccl.so.2 {} loads here", nccl_code_text(code))
                         : std::string("libnccl.so.2 loads here but reports no version");
  dlclose(library);
  return text;
}
#endif

// MPI libraries pad their version strings with tabs and runs of spaces.
std::string one_line(const std::string& text) {
  std::string out;
  for (const char c : text) {
    const bool space = std::isspace(static_cast<unsigned char>(c)) != 0;
    if (space && (out.empty() || out.back() == ' ')) continue;
    out += space ? ' ' : c;
  }
  while (!out.empty() && out.back() == ' ') out.pop_back();
  return out;
}

}  // namespace

int main() {
  const dtrain::BuildInfo info = dtrain::build_info();
  fmt::print("dtrain {}\n", info.dtrain_version);
  fmt::print("  MPI: {} ({})\n", info.mpi_flavor, one_line(info.mpi_library));
#if defined(DTRAIN_BUILD_INFO_CUDA)
  fmt::print("  CUDA: yes, dtrain::cuda built against CUDA runtime {}.{}\n",
             CUDART_VERSION / 1000, (CUDART_VERSION % 1000) / 10);
  fmt::print("  NCCL: built against {}; {}\n",
             nccl_code_text(NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH)), loadable_nccl());
#else
  fmt::print("  CUDA: no (configured without the CUDA toolkit and NCCL)\n");
  fmt::print("  NCCL: none\n");
#endif
  return std::fflush(stdout) == 0 ? 0 : 1;
}
