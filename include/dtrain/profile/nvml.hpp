#pragma once
// GPU utilization and memory through NVML, loaded at run time with dlopen: dtrain neither links
// against the driver nor needs its headers, and a machine without the NVIDIA driver simply has no
// GPU metrics (the reason is recorded in the profile's header; it is not an error).
//
// The few NVML declarations needed are restated below; they are NVML's stable C ABI (nvml.h):
// every function returns nvmlReturn_t, 0 meaning success.
#include <dlfcn.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include <fmt/format.h>

namespace dtrain::detail {

struct GpuReading {
  double utilization_pct = 0;         // time a kernel was running, over NVML's last period
  double memory_utilization_pct = 0;  // time device memory was read or written
  std::uint64_t memory_used_bytes = 0;
  std::uint64_t memory_total_bytes = 0;
};

class Nvml {
 public:
  Nvml() = default;
  Nvml(const Nvml&) = delete;
  Nvml& operator=(const Nvml&) = delete;
  Nvml(Nvml&& o) noexcept { *this = std::move(o); }
  Nvml& operator=(Nvml&& o) noexcept {
    if (this != &o) {
      close();
      lib_ = std::exchange(o.lib_, nullptr);
      api_ = std::exchange(o.api_, Api{});
      device_ = std::exchange(o.device_, nullptr);
      initialized_ = std::exchange(o.initialized_, false);
      index_ = o.index_;
      name_ = std::move(o.name_);
      memory_total_ = o.memory_total_;
      reason_ = std::move(o.reason_);
    }
    return *this;
  }
  ~Nvml() { close(); }

  // Loads `library` and opens device `index` (-1: `fallback_index` modulo the device count).
  // Never throws: on any failure the result is unavailable and reason() says why.
  static Nvml open(const std::string& library, int index, int fallback_index) {
    Nvml n;
    n.lib_ = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!n.lib_) {
      const char* err = dlerror();
      // dlerror() names the library; without a message, name it ourselves.
      n.reason_ = err ? fmt::format("NVML not loaded: {}", err)
                      : fmt::format("NVML not loaded: dlopen({}) failed", library);
      return n;
    }
    if (!n.bind()) return n;
    if (int rc = n.api_.init(); rc != 0) {
      n.reason_ = fmt::format("nvmlInit failed: {}", n.error_string(rc));
      n.close();
      return n;
    }
    n.initialized_ = true;
    unsigned count = 0;
    if (int rc = n.api_.get_count(&count); rc != 0 || count == 0) {
      n.reason_ = rc != 0 ? fmt::format("nvmlDeviceGetCount failed: {}", n.error_string(rc))
                          : std::string("NVML reports no GPU");
      n.close();
      return n;
    }
    const int chosen = index >= 0 ? index : fallback_index % static_cast<int>(count);
    if (chosen < 0 || static_cast<unsigned>(chosen) >= count) {
      n.reason_ = fmt::format("GPU index {} is not among the {} devices NVML reports", chosen,
                              count);
      n.close();
      return n;
    }
    if (int rc = n.api_.get_handle(static_cast<unsigned>(chosen), &n.device_); rc != 0) {
      n.reason_ = fmt::format("nvmlDeviceGetHandleByIndex({}) failed: {}", chosen,
                              n.error_string(rc));
      n.close();
      return n;
    }
    n.index_ = chosen;
    char name[96] = {};
    if (n.api_.get_name(n.device_, name, sizeof name - 1) == 0) n.name_ = name;
    if (auto r = n.read()) n.memory_total_ = r->memory_total_bytes;
    return n;
  }

  bool available() const noexcept { return device_ != nullptr; }
  const std::string& reason() const noexcept { return reason_; }
  int index() const noexcept { return index_; }
  const std::string& name() const noexcept { return name_; }
  std::uint64_t memory_total_bytes() const noexcept { return memory_total_; }

  std::optional<GpuReading> read() const {
    if (!device_) return std::nullopt;
    Utilization u{};
    Memory m{};
    if (api_.get_utilization(device_, &u) != 0 || api_.get_memory(device_, &m) != 0)
      return std::nullopt;
    return GpuReading{static_cast<double>(u.gpu), static_cast<double>(u.memory), m.used, m.total};
  }

 private:
  struct Device;  // nvmlDevice_t is an opaque pointer
  struct Utilization {
    unsigned gpu, memory;
  };
  struct Memory {
    unsigned long long total, free, used;
  };
  struct Api {
    int (*init)() = nullptr;
    int (*shutdown)() = nullptr;
    int (*get_count)(unsigned*) = nullptr;
    int (*get_handle)(unsigned, Device**) = nullptr;
    int (*get_name)(Device*, char*, unsigned) = nullptr;
    int (*get_utilization)(Device*, Utilization*) = nullptr;
    int (*get_memory)(Device*, Memory*) = nullptr;
    const char* (*error_string)(int) = nullptr;
  };

  template <class F>
  bool bind_one(F& f, const char* symbol) {
    f = reinterpret_cast<F>(dlsym(lib_, symbol));
    if (!f) reason_ = fmt::format("NVML lacks {}", symbol);
    return f != nullptr;
  }
  bool bind() {
    const bool ok = bind_one(api_.init, "nvmlInit_v2") &&
                    bind_one(api_.shutdown, "nvmlShutdown") &&
                    bind_one(api_.get_count, "nvmlDeviceGetCount_v2") &&
                    bind_one(api_.get_handle, "nvmlDeviceGetHandleByIndex_v2") &&
                    bind_one(api_.get_name, "nvmlDeviceGetName") &&
                    bind_one(api_.get_utilization, "nvmlDeviceGetUtilizationRates") &&
                    bind_one(api_.get_memory, "nvmlDeviceGetMemoryInfo") &&
                    bind_one(api_.error_string, "nvmlErrorString");
    if (!ok) close();
    return ok;
  }
  std::string error_string(int rc) const {
    const char* s = api_.error_string ? api_.error_string(rc) : nullptr;
    return s ? fmt::format("{} (NVML error {})", s, rc) : fmt::format("NVML error {}", rc);
  }

  void close() noexcept {
    if (initialized_) api_.shutdown();
    initialized_ = false;
    device_ = nullptr;
    if (lib_) dlclose(lib_);
    lib_ = nullptr;
  }

  void* lib_ = nullptr;
  Api api_;
  Device* device_ = nullptr;
  bool initialized_ = false;  // nvmlInit succeeded: nvmlShutdown is owed
  int index_ = -1;
  std::string name_;
  std::uint64_t memory_total_ = 0;
  std::string reason_;
};

}  // namespace dtrain::detail
