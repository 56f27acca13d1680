// The device kernels are compiled at run time by NVRTC. NVRTC needs no GPU, so this test compiles
// the real kernel source on every CI machine: a syntax or type error in a kernel fails here.
#include "dtrain/cuda/kernel_source.hpp"
#include "dtrain/cuda/nvrtc.hpp"

#include <doctest/doctest.h>

#include <string>
#include <vector>

using namespace dtrain::detail;

namespace {
bool has_entry(const std::string& ptx, const char* name) {
  return ptx.find(std::string(".entry ") + name + "(") != std::string::npos;
}
}  // namespace

TEST_CASE("nvrtc: the kernel source compiles to PTX for sm_80 and sm_90 with every entry point") {
  for (int arch : {80, 90}) {
    CAPTURE(arch);
    const KernelImage img = compile_kernels(kernel_source, arch, KernelImageKind::ptx);
    CHECK(img.kind == KernelImageKind::ptx);
    CHECK(img.arch == arch);
    REQUIRE(img.data.size() > 1000);
    CHECK(img.data.back() == '\0');  // NUL-terminated, as the loader expects for PTX
    CHECK(img.data.find(".target sm_" + std::to_string(arch)) != std::string::npos);
    for (const char* name : kernel_names) {
      CAPTURE(name);
      CHECK(has_entry(img.data, name));
    }
    // The descriptor batch is read from the parameter space, never spilled to local memory.
    CHECK(img.data.find(".local") == std::string::npos);
  }
}

TEST_CASE("nvrtc: a cubin for sm_90 is ELF machine code") {
  const KernelImage img = compile_kernels(kernel_source, 90, KernelImageKind::cubin);
  REQUIRE(img.data.size() > 4);
  CHECK(img.data.substr(0, 4) == std::string("\x7f" "ELF", 4));
}

TEST_CASE("nvrtc: a compile error reports the compiler log") {
  const std::string broken = "extern \"C\" __global__ void k(int* p) { p[0] = undefined_name; }";
  CHECK_THROWS_WITH_AS(compile_kernels(broken, 90, KernelImageKind::ptx),
                       doctest::Contains("undefined_name"), dtrain::Error);
}

TEST_CASE("nvrtc: architecture choice — cubin when known, else PTX of the newest older arch") {
  const std::vector<int> supported = {75, 80, 86, 89, 90, 100, 120};
  int target = 0;
  CHECK(choose_image_kind(90, supported, target) == KernelImageKind::cubin);
  CHECK(target == 90);
  CHECK(choose_image_kind(87, supported, target) == KernelImageKind::ptx);
  CHECK(target == 86);
  CHECK(choose_image_kind(130, supported, target) == KernelImageKind::ptx);
  CHECK(target == 120);
  CHECK_THROWS_WITH_AS(choose_image_kind(61, supported, target),
                       doctest::Contains("compute capability 6.1"), dtrain::Error);
}

TEST_CASE("nvrtc: this NVRTC can build for the GPUs the device checks run on") {
  const auto archs = nvrtc_supported_archs();
  REQUIRE_FALSE(archs.empty());
  int target = 0;
  CHECK(choose_image_kind(80, archs, target) == KernelImageKind::cubin);
  CHECK(choose_image_kind(90, archs, target) == KernelImageKind::cubin);
}
