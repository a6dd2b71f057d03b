// GPU figures for `trainctl top` from NVML, the NVIDIA driver's management library. trainctl does
// not link it: libnvidia-ml.so.1 is loaded at run time when the machine has it (a CPU build and a
// machine without the driver show no GPU columns). Not thread-safe: call from one thread.
#pragma once

#include <cstdint>
#include <vector>

namespace trainctl::monitor {

struct GpuUse {
  int64_t pid = 0;
  int device = -1;              // NVML's index
  double memory_mib = 0;        // what the process holds on it
  int device_utilization = -1;  // the device's busy percentage over NVML's last sample period
};

// Whether NVML loaded and sees at least one device.
bool GpusPresent();

// Every compute process on every device (a process on two devices appears twice).
std::vector<GpuUse> GpuProcesses();

}  // namespace trainctl::monitor
