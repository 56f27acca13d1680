#pragma once
// Run-time compilation of the kernel source (cuda/kernel_source.hpp) with NVRTC. Needs only
// <nvrtc.h> and libnvrtc, never a GPU, so the kernels are compiled in CPU-only CI too.
#include <nvrtc.h>

#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "dtrain/core/error.hpp"

namespace dtrain::detail {

enum class KernelImageKind {
  cubin,  // machine code for exactly one architecture: loads without JIT
  ptx,    // virtual ISA: the driver JIT-compiles it for the device at load time
};

struct KernelImage {
  KernelImageKind kind = KernelImageKind::cubin;
  int arch = 0;        // e.g. 90 for sm_90 / compute_90
  std::string data;    // cubin bytes, or NUL-terminated PTX text
  std::string log;     // compiler messages (warnings)
};

inline void nvrtc_check(nvrtcResult r, std::string_view call) {
  if (r != NVRTC_SUCCESS)
    throw Error(fmt::format("dtrain: {} failed: {}", call, nvrtcGetErrorString(r)));
}

// Architectures this NVRTC can compile for (e.g. 75, 80, 86, 89, 90, ...), ascending.
inline std::vector<int> nvrtc_supported_archs() {
  int n = 0;
  nvrtc_check(nvrtcGetNumSupportedArchs(&n), "nvrtcGetNumSupportedArchs");
  std::vector<int> archs(static_cast<std::size_t>(n));
  nvrtc_check(nvrtcGetSupportedArchs(archs.data()), "nvrtcGetSupportedArchs");
  std::sort(archs.begin(), archs.end());
  return archs;
}

// What to build for a device of compute capability `device_arch` (major*10 + minor): a cubin
// when NVRTC knows the architecture, otherwise PTX for the newest older one (the driver JITs it;
// this is how a GPU newer than the toolkit still runs).
inline KernelImageKind choose_image_kind(int device_arch, const std::vector<int>& supported,
                                         int& target_arch) {
  if (std::find(supported.begin(), supported.end(), device_arch) != supported.end()) {
    target_arch = device_arch;
    return KernelImageKind::cubin;
  }
  target_arch = 0;
  for (int a : supported)
    if (a <= device_arch) target_arch = a;
  if (target_arch == 0)
    throw Error(fmt::format(
        "dtrain: this NVRTC cannot compile for compute capability {}.{} (it supports {} and "
        "newer): the GPU is too old for the CUDA toolkit dtrain was built with; build with an "
        "older CUDA toolkit",
        device_arch / 10, device_arch % 10,
        supported.empty() ? std::string("nothing") : fmt::format("sm_{}", supported.front())));
  return KernelImageKind::ptx;
}

// Compiles `source` for `arch`. Throws dtrain::Error carrying the compiler log on failure.
inline KernelImage compile_kernels(std::string_view source, int arch, KernelImageKind kind,
                                   std::string_view program_name = "dtrain_kernels.cu") {
  KernelImage out;
  out.kind = kind;
  out.arch = arch;
  const std::string src(source), name(program_name);
  nvrtcProgram prog = nullptr;
  nvrtc_check(nvrtcCreateProgram(&prog, src.c_str(), name.c_str(), 0, nullptr, nullptr),
              "nvrtcCreateProgram");
  struct Destroy {
    nvrtcProgram* p;
    ~Destroy() { nvrtcDestroyProgram(p); }
  } destroy{&prog};

  const std::string arch_opt = fmt::format(
      "--gpu-architecture={}_{}", kind == KernelImageKind::cubin ? "sm" : "compute", arch);
  // No fast-math flags: scaling must round exactly like the host code (and keep denormals).
  const char* opts[] = {arch_opt.c_str(), "--std=c++17"};
  const nvrtcResult compiled = nvrtcCompileProgram(prog, 2, opts);

  std::size_t log_size = 0;
  nvrtcGetProgramLogSize(prog, &log_size);
  if (log_size > 1) {
    out.log.resize(log_size);
    nvrtcGetProgramLog(prog, out.log.data());
    while (!out.log.empty() && out.log.back() == '\0') out.log.pop_back();
  }
  if (compiled != NVRTC_SUCCESS)
    throw Error(fmt::format("dtrain: NVRTC could not compile the device kernels for {}: {}\n{}",
                            arch_opt, nvrtcGetErrorString(compiled), out.log));

  std::size_t size = 0;
  if (kind == KernelImageKind::cubin) {
    nvrtc_check(nvrtcGetCUBINSize(prog, &size), "nvrtcGetCUBINSize");
    out.data.resize(size);
    nvrtc_check(nvrtcGetCUBIN(prog, out.data.data()), "nvrtcGetCUBIN");
  } else {
    nvrtc_check(nvrtcGetPTXSize(prog, &size), "nvrtcGetPTXSize");  // includes the NUL
    out.data.resize(size);
    nvrtc_check(nvrtcGetPTX(prog, out.data.data()), "nvrtcGetPTX");
  }
  return out;
}

}  // namespace dtrain::detail
