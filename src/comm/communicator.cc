#include "comm/communicator.h"

#include <unistd.h>

#include <vector>

#include "common/address.h"
#include "common/strings.h"

namespace trainctl::comm {

Status CheckGroup(const char* backend, int rank, int size) {
  if (size >= 1 && rank >= 0 && rank < size) return Status::Ok();
  return InvalidArgument(std::string(backend) + ": rank " + std::to_string(rank) + " out of range for size " +
                         std::to_string(size));
}

Result<std::unique_ptr<SharedAverage>> Communicator::MakeSharedAverage(size_t) {
  return InvalidArgument("this backend has no shared memory");
}

Result<std::unique_ptr<DeviceAllReduce>> Communicator::MakeDeviceAllReduce() {
  return InvalidArgument("this backend has no GPU streams");
}

namespace {

// One rank alone: every collective is already complete.
class LocalCommunicator : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  Status AllReduceSum(float*, size_t) override { return Status::Ok(); }
  Status Broadcast(void*, size_t, int) override { return Status::Ok(); }
  Status Barrier() override { return Status::Ok(); }
};

}  // namespace

std::unique_ptr<Communicator> ConnectLocal() { return std::make_unique<LocalCommunicator>(); }

namespace {
std::string HostKey(int rank) { return "rank/" + std::to_string(rank) + "/host"; }
std::string StalledKey(int rank) { return "rank/" + std::to_string(rank) + "/timed_out"; }
}  // namespace

Status AnnounceRank(Store& store, int rank, const std::string& address) {
  return store.Set(HostKey(rank), HostName() + " (" + address + ", pid " + std::to_string(::getpid()) + ")");
}

Status NameStalledRanks(Store& store, int rank, int size, Duration grace, const Status& error) {
  if (!store.Set(StalledKey(rank), "1").ok()) return error;
  const auto deadline = Clock::now() + grace;
  std::vector<int> silent;
  for (int r = 0; r < size; ++r) silent.push_back(r);
  while (true) {
    std::vector<int> still;
    for (int r : silent) {
      auto got = store.TryGet(StalledKey(r));
      if (!got.ok()) return error;
      if (!got->has_value()) still.push_back(r);
    }
    silent.swap(still);
    if (silent.empty() || Clock::now() >= deadline) break;
    auto ignored = store.Wait({StalledKey(silent[0])}, std::min(Remaining(deadline), Duration(100)));
  }
  if (silent.empty()) return error;  // every rank is alive and waiting: a mismatched call order
  std::vector<std::string> names;
  for (int r : silent) {
    auto host = store.TryGet(HostKey(r));
    std::string where = host.ok() && host->has_value() ? " on " + **host : "";
    names.push_back("rank " + std::to_string(r) + where);
  }
  return Status(error.code(), error.message() + "; stalled or unreachable: " + Join(names, ", ") +
                                  " (the other ranks reported the timeout)");
}

#ifndef TRAINCTL_WITH_NCCL
bool NcclAvailable() { return false; }

Result<std::unique_ptr<Communicator>> ConnectNccl(Store&, const NcclOptions&) {
  return InvalidArgument(
      "nccl: this trainctl was built without CUDA and NCCL; build it where "
      "CUDA and NCCL are found (see docs/trainer.md, GPUs)");
}
#endif

}  // namespace trainctl::comm
