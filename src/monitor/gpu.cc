#include "monitor/gpu.h"

#include <dlfcn.h>

namespace trainctl::monitor {
namespace {

// The few NVML entry points used, with the ABI of nvml.h (stable since CUDA 11).
using Device = void*;
struct Utilization {
  unsigned gpu, memory;
};
struct ProcessInfo {  // nvmlProcessInfo_t as the _v2 and _v3 queries fill it
  unsigned pid;
  unsigned long long used_gpu_memory;
  unsigned gpu_instance_id, compute_instance_id;
};
constexpr int kSuccess = 0;
constexpr int kInsufficientSize = 7;

struct Nvml {
  int (*init)() = nullptr;
  int (*count)(unsigned*) = nullptr;
  int (*handle)(unsigned, Device*) = nullptr;
  int (*utilization)(Device, Utilization*) = nullptr;
  int (*processes)(Device, unsigned*, ProcessInfo*) = nullptr;
  bool ok = false;
};

template <typename F>
bool Load(void* lib, const char* name, F* out) {
  *out = reinterpret_cast<F>(::dlsym(lib, name));
  return *out != nullptr;
}

const Nvml& Library() {
  static const Nvml nvml = [] {
    Nvml n;
    void* lib = ::dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) return n;
    const bool all = Load(lib, "nvmlInit_v2", &n.init) && Load(lib, "nvmlDeviceGetCount_v2", &n.count) &&
                     Load(lib, "nvmlDeviceGetHandleByIndex_v2", &n.handle) &&
                     Load(lib, "nvmlDeviceGetUtilizationRates", &n.utilization) &&
                     (Load(lib, "nvmlDeviceGetComputeRunningProcesses_v3", &n.processes) ||
                      Load(lib, "nvmlDeviceGetComputeRunningProcesses_v2", &n.processes));
    n.ok = all && n.init() == kSuccess;
    return n;  // the library stays loaded for the process's life
  }();
  return nvml;
}

unsigned DeviceCount() {
  const Nvml& n = Library();
  unsigned count = 0;
  if (!n.ok || n.count(&count) != kSuccess) return 0;
  return count;
}

}  // namespace

bool GpusPresent() { return DeviceCount() > 0; }

std::vector<GpuUse> GpuProcesses() {
  std::vector<GpuUse> out;
  const Nvml& n = Library();
  const unsigned devices = DeviceCount();
  for (unsigned d = 0; d < devices; ++d) {
    Device dev = nullptr;
    if (n.handle(d, &dev) != kSuccess) continue;
    Utilization u{};
    const int busy = n.utilization(dev, &u) == kSuccess ? static_cast<int>(u.gpu) : -1;
    std::vector<ProcessInfo> infos(64);
    unsigned count = static_cast<unsigned>(infos.size());
    int rc = n.processes(dev, &count, infos.data());
    if (rc == kInsufficientSize) {  // more processes than room: ask again with room for all
      infos.resize(count + 16);
      count = static_cast<unsigned>(infos.size());
      rc = n.processes(dev, &count, infos.data());
    }
    if (rc != kSuccess) continue;
    for (unsigned i = 0; i < count && i < infos.size(); ++i) {
      out.push_back({static_cast<int64_t>(infos[i].pid), static_cast<int>(d),
                     static_cast<double>(infos[i].used_gpu_memory) / (1024.0 * 1024.0), busy});
    }
  }
  return out;
}

}  // namespace trainctl::monitor
