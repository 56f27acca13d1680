// The CUDA/NCCL device path in one process. Without a GPU (CI) this binary still links CUDA, NCCL
// and NVRTC, checks everything that needs no device (registration with the engine, the NCCL
// library, error reporting when there is no device), prints "no CUDA device: skipped" and passes.
// With a GPU it checks the kernels, compression, the host wait loop, and every collective through
// NCCL at world size 1.
#include <cuda_runtime.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <random>
#include <regex>
#include <set>
#include <thread>
#include <vector>

#include <doctest/doctest.h>

#include "collective_checks.hpp"
#include "dtrain/cuda.hpp"
#include "gpu_test_support.hpp"

using namespace dtrain;
using gpu_test::have_device;

namespace {

void init_once() {
  if (!is_initialized()) init();
}

}  // namespace

// ---- no device needed -----------------------------------------------------------------------------

TEST_CASE("cuda support registers its backend, allocator and NCCL version with the core") {
  // Parenthesized: doctest cannot print function pointers.
  CHECK((detail::device_backend_factory() == &detail::make_cuda_backend));
  CHECK((detail::cuda_allocator().allocate == &detail::cuda_allocate));
  CHECK((detail::cuda_allocator().deallocate == &detail::cuda_deallocate));
  const BuildInfo b = build_info();
  CHECK(b.cuda);
  CHECK(std::regex_match(b.nccl_version, std::regex(R"(\d+\.\d+\.\d+)")));
  CHECK(b.nccl_version == detail::nccl_version_string());
  CHECK(detail::nccl_runtime_version() >= 21400);
}

TEST_CASE("nccl: every dtype and reduce op has its own NCCL counterpart") {
  std::set<int> types;
  for (DataType d : all_data_types) types.insert(static_cast<int>(detail::nccl_datatype(d)));
  CHECK(types.size() == std::size(all_data_types));
  CHECK(detail::nccl_datatype(DataType::bfloat16) == ncclBfloat16);
  CHECK(detail::nccl_datatype(DataType::float16) == ncclFloat16);
  CHECK(detail::nccl_op(ReduceOp::Average) == ncclAvg);
  CHECK(detail::nccl_op(ReduceOp::Product) == ncclProd);
  CHECK(detail::nccl_has_avg());
}

TEST_CASE("nccl and cuda errors name the call, the library's text and the likely cause") {
  const std::string nccl = detail::nccl_error_message(ncclSystemError, "ncclAllReduce on world",
                                                      "socket closed");
  CHECK(nccl.find("ncclAllReduce on world failed") != std::string::npos);
  CHECK(nccl.find("socket closed") != std::string::npos);
  CHECK(nccl.find("/dev/shm") != std::string::npos);
  const std::string cuda = detail::cuda_error_message(cudaErrorNoDevice, "cudaSetDevice(0)");
  CHECK(cuda.find("cudaErrorNoDevice") != std::string::npos);
  CHECK(cuda.find("CUDA_VISIBLE_DEVICES") != std::string::npos);
}

TEST_CASE("without a device: clear errors from device selection and device allocation") {
  init_once();
  if (cuda::device_count() > 0) {
    // With a device the same calls succeed.
    CHECK(cuda::set_device_from_local_rank() == local_rank() % cuda::device_count());
    OwnedTensor t(DataType::float32, {4}, Device::cuda(0));
    CHECK(t.data() != nullptr);
    return;
  }
  CHECK_FALSE(cuda::is_available());
  CHECK_THROWS_WITH_AS(cuda::set_device_from_local_rank(), doctest::Contains("sees no CUDA device"),
                       Error);
  CHECK_THROWS_WITH_AS(OwnedTensor(DataType::float32, {4}, Device::cuda(0)),
                       doctest::Contains("cudaMalloc"), Error);
  have_device();  // prints the skip line for the rest of the file
}

// ---- kernels ----------------------------------------------------------------------------------------

TEST_CASE("kernels: batched scaled copies match the host scaling bit for bit") {
  if (!have_device()) return;
  init_once();
  const int device = cuda::set_device_from_local_rank();
  const auto& k = detail::KernelLibrary::instance().for_device(device);
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> dist(-100.f, 100.f);
  for (DataType dtype : all_data_types) {
    for (double scale : {1.0, 0.37, 3.0}) {
      if (scale != 1.0 && !is_floating_point(dtype)) continue;
      CAPTURE(std::string(to_string(dtype)));
      CAPTURE(scale);
      const std::size_t es = element_size(dtype);
      // 200 tensors (three launches), some a block long, some unaligned by one element, every
      // third with a null source (zeros).
      std::vector<std::int64_t> counts;
      for (int i = 0; i < 200; ++i) counts.push_back(i % 17 == 0 ? 32768 / es + 1 : 1 + rng() % 3000);
      std::int64_t total = 0;
      for (auto c : counts) total += c + 1;
      std::vector<char> src_host(static_cast<std::size_t>(total) * es);
      for (std::size_t i = 0; i < src_host.size(); ++i) src_host[i] = static_cast<char>(rng());
      if (is_floating_point(dtype)) {  // finite values, so scaling compares as numbers
        std::vector<double> vals(static_cast<std::size_t>(total));
        for (auto& v : vals) v = dist(rng);
        src_host = gpu_test::encode(dtype, vals);
      }
      gpu_test::DeviceBytes src(src_host), dst(src_host.size());
      std::vector<detail::CopySegment> segs;
      std::vector<char> want(src_host.size(), static_cast<char>(0xEE));
      std::int64_t off = 0;
      for (std::size_t i = 0; i < counts.size(); ++i) {
        const std::int64_t o = off + static_cast<std::int64_t>(i % 2);  // odd offsets: unaligned
        char* d = static_cast<char*>(dst.get()) + o * es;
        const char* s = static_cast<const char*>(src.get()) + o * es;
        const bool zero = i % 3 == 0;
        segs.push_back({zero ? nullptr : s, d, counts[i]});
        if (zero) std::memset(want.data() + o * es, 0, counts[i] * es);
        else detail::scale_copy(dtype, src_host.data() + o * es, want.data() + o * es, counts[i], scale);
        off += counts[i] + 1;
      }
      detail::batched_copy(k, segs, dtype, scale, nullptr);
      gpu_test::check_cuda(cudaDeviceSynchronize());
      const auto got = dst.to_host<char>(src_host.size());
      CHECK(std::memcmp(got.data(), want.data(), got.size()) == 0);
    }
  }
}

TEST_CASE("compression: float32 <-> float16/bfloat16 round trips, scaled, many tensors a launch") {
  if (!have_device()) return;
  init_once();
  cuda::set_device_from_local_rank();
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> dist(-70000.f, 70000.f);
  std::vector<float> host(50003);
  for (auto& x : host) x = dist(rng) * (rng() % 2 ? 1e-6f : 1.f);
  host[0] = 0.f;
  host[1] = -0.f;
  host[2] = 65504.f;
  host[3] = 1e-8f;  // below fp16's subnormals
  host[4] = std::nanf("");
  gpu_test::DeviceBytes src(host);
  for (DataType half : {DataType::float16, DataType::bfloat16}) {
    for (double scale : {1.0, 0.125}) {
      CAPTURE(std::string(to_string(half)));
      CAPTURE(scale);
      gpu_test::DeviceBytes narrow(host.size() * 2), wide(host.size() * 4);
      // Three tensors in one launch, the middle one misaligned for the vector path.
      const std::int64_t a = 20001, b = 9999, c = static_cast<std::int64_t>(host.size()) - a - b;
      const float* s = static_cast<const float*>(src.get());
      auto* n16 = static_cast<std::uint16_t*>(narrow.get());
      std::vector<cuda::ConvertItem> items = {{s, n16, a}, {s + a, n16 + a, b}, {s + a + b, n16 + a + b, c}};
      cuda::compress(items, half, nullptr, scale);
      cuda::decompress(n16, half, static_cast<float*>(wide.get()), static_cast<std::int64_t>(host.size()),
                       nullptr, 1.0 / scale);
      gpu_test::check_cuda(cudaDeviceSynchronize());
      const auto bits = narrow.to_host<std::uint16_t>(host.size());
      const auto back = wide.to_host<float>(host.size());
      for (std::size_t i = 0; i < host.size(); ++i) {
        const float scaled = host[i] * static_cast<float>(scale);
        const std::uint16_t want = half == DataType::float16 ? detail::float_to_half(scaled)
                                                             : detail::float_to_bf16(scaled);
        const float want_back = (half == DataType::float16 ? detail::half_to_float(want)
                                                           : detail::bf16_to_float(want)) *
                                static_cast<float>(1.0 / scale);
        CAPTURE(i);
        if (std::isnan(scaled)) {
          CHECK(std::isnan(back[i]));
          continue;
        }
        REQUIRE(bits[i] == want);
        REQUIRE(std::memcmp(&back[i], &want_back, sizeof(float)) == 0);
      }
    }
  }
  CHECK_THROWS_AS(cuda::compress(static_cast<const float*>(src.get()), nullptr, 1, DataType::int32),
                  InvalidArgumentError);
}

TEST_CASE("wait loop: a device op that never finishes in time becomes a TimeoutError") {
  if (!have_device()) return;
  init_once();
  cuda::set_device_from_local_rank();
  cudaStream_t s = nullptr;
  cudaEvent_t e = nullptr;
  gpu_test::check_cuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  gpu_test::check_cuda(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  // A host function blocks the stream for 1.5 s: the event behind it stays pending.
  gpu_test::check_cuda(cudaLaunchHostFunc(
      s, [](void*) { std::this_thread::sleep_for(std::chrono::milliseconds(1500)); }, nullptr));
  gpu_test::check_cuda(cudaEventRecord(e, s));
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH_AS(detail::wait_for_device(e, {}, detail::Deadline::after(0.2), "test op"),
                       doctest::Contains("did not complete on the device within 0.2 s"),
                       TimeoutError);
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(1400));
  // Without a deadline the same wait returns once the work is done.
  detail::wait_for_device(e, {}, detail::Deadline::after(0), "test op");
  CHECK(cudaEventQuery(e) == cudaSuccess);
  cudaEventDestroy(e);
  cudaStreamDestroy(s);
}

// ---- collectives through NCCL at world size 1 -------------------------------------------------------

TEST_CASE("nccl: allreduce of every dtype and op, lone and fused, with scaling") {
  if (!have_device()) return;
  init_once();
  const int device = cuda::set_device_from_local_rank();
  gpu_test::check_allreduce(device, rank(), size());
  CHECK(cuda::active_transport() == cuda::Transport::nccl);
  CHECK(engine_stats().fused_collectives > 0);
}

TEST_CASE("nccl: allgather, broadcast, reducescatter and alltoall of every dtype") {
  if (!have_device()) return;
  init_once();
  const int device = cuda::set_device_from_local_rank();
  gpu_test::check_allgather(device, rank(), size());
  gpu_test::check_broadcast(device, rank(), size());
  gpu_test::check_reducescatter(device, rank(), size());
  gpu_test::check_alltoall(device, rank(), size());
}

TEST_CASE("nccl: the op waits for the producer's stream and its result is visible after wait()") {
  if (!have_device()) return;
  init_once();
  gpu_test::check_producer_stream_ordering(cuda::set_device_from_local_rank(), rank(), size());
}
