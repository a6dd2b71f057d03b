// A stand-in for the NVIDIA driver's libnvidia-ml.so.1 with the ABI of nvml.h, for testing
// `trainctl top`'s GPU columns on machines without a GPU (a real GPU is checked on the device
// machine). One device, 87 % busy, running the process NVML_STANDIN_PID with 1234 MiB.
#include <cstdlib>

extern "C" {

typedef struct {
  unsigned gpu, memory;
} Utilization;
typedef struct {
  unsigned pid;
  unsigned long long used_gpu_memory;
  unsigned gpu_instance_id, compute_instance_id;
} ProcessInfo;

int nvmlInit_v2(void) { return 0; }
int nvmlDeviceGetCount_v2(unsigned* count) {
  *count = 1;
  return 0;
}
int nvmlDeviceGetHandleByIndex_v2(unsigned index, void** device) {
  *device = reinterpret_cast<void*>(static_cast<size_t>(index) + 1);
  return index == 0 ? 0 : 2;
}
int nvmlDeviceGetUtilizationRates(void* device, Utilization* u) {
  (void)device;
  u->gpu = 87;
  u->memory = 40;
  return 0;
}
int nvmlDeviceGetComputeRunningProcesses_v3(void* device, unsigned* count, ProcessInfo* infos) {
  (void)device;
  const char* pid = std::getenv("NVML_STANDIN_PID");
  if (!pid) {
    *count = 0;
    return 0;
  }
  if (*count < 1) {
    *count = 1;
    return 7;  // NVML_ERROR_INSUFFICIENT_SIZE
  }
  *count = 1;
  infos[0].pid = static_cast<unsigned>(std::atoi(pid));
  infos[0].used_gpu_memory = 1234ull << 20;
  infos[0].gpu_instance_id = infos[0].compute_instance_id = 0xFFFFFFFFu;
  return 0;
}

}  // extern "C"
