// Communicator: the collectives the trainer needs (allreduce, broadcast, barrier) among the
// ranks of one worker group. Backends live in subfolders: gloo/ (CPU buffers over TCP), shm/ (CPU
// buffers, ranks on one host), nccl/ (GPU buffers). No torch here: collectives work on plain
// buffers, and the trainer hands them tensor memory.
//
// Every call blocks until it completes on this rank or `timeout` (set at connect) passes; then it
// returns kTimeout and the communicator is broken: a peer may be dead or stalled, and the caller's
// job is to stop and let the agent start a new round. Calls must be made in the same order on
// every rank. Not thread safe: one thread at a time (the trainer's reducer thread, or the main
// thread while the reducer is idle).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/duration.h"
#include "common/status.h"
#include "store/store.h"

namespace trainctl::comm {

// Averaging of one float buffer per rank that lives in memory every rank maps (shm only).
// Each rank writes its contribution straight into input() and may Post() the parts that are
// final; in Average() the ranks average parts of everyone's inputs into a shared result that
// every rank reads, starting with parts every rank has posted while the others still compute.
// That is what a trainer's gradient averaging needs with the least memory traffic and the least
// waiting: no copies in or out, no separate division, and no thread.
class SharedAverage {
 public:
  virtual ~SharedAverage() = default;
  // This rank's contribution to the next Average() (count floats), all zeros until this rank
  // writes to it (Average() zeroes the inputs it has read); it may be a different buffer after
  // each call.
  virtual float* input() = 0;
  // The mean, the same bits on every rank (count floats); written by Average(), valid until
  // the next call.
  virtual const float* result() const = 0;
  // Optional, before Average(): input()[0, ready) is final, and peers that wait in Average()
  // may average it already.
  virtual void Post(size_t ready) = 0;
  // A collective: result[i] = (input_0[i] + ... + input_{n-1}[i]) / n, added in rank order;
  // every input is zero afterwards.
  virtual Status Average() = 0;
};

// Sums of GPU buffers queued in stream order (NCCL only), for a trainer's gradient buckets: the
// sums wait on the GPU for the gradients, the trainer's next kernels wait on the GPU for the sums,
// and the host waits for neither, so the GPU never idles between steps. Streams are
// cudaStream_t handles, passed as void* so that nothing here needs CUDA's headers.
// A watchdog gives the sums of each Join() the communicator's timeout; after it, it aborts the
// communicator, which ends NCCL's kernels (whatever waits on the streams goes on), and every
// later call returns kTimeout. Enqueue and Join are communicator calls: one thread at a time.
class DeviceAllReduce {
 public:
  virtual ~DeviceAllReduce() = default;
  // Queues data[i] = sum over ranks of data[i] (count floats of device memory) after the work
  // queued so far on `stream`; returns once it is queued. Every rank queues the same sums in
  // the same order.
  virtual Status Enqueue(float* data, size_t count, void* stream) = 0;
  // Makes `stream` wait for every sum queued so far. The host first waits until the sums of the
  // previous Join() are done (so the host runs at most one step ahead): bounded by the timeout.
  virtual Status Join(void* stream) = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // data[i] = sum over ranks of data[i]; every rank ends with the same bits.
  virtual Status AllReduceSum(float* data, size_t count) = 0;
  // Copies `bytes` bytes at `data` from rank `root` to every rank.
  virtual Status Broadcast(void* data, size_t bytes, int root) = 0;
  virtual Status Barrier() = 0;
  // A collective: a SharedAverage of `count` floats per rank, which must not outlive the
  // communicator. Where the backend has no shared memory, or there is no room for it, every
  // rank gets an error and the communicator stays usable: callers fall back to AllReduceSum.
  virtual Result<std::unique_ptr<SharedAverage>> MakeSharedAverage(size_t count);
  // A DeviceAllReduce, which must not outlive the communicator; backends without GPU streams
  // return kInvalidArgument (not a collective: no rank needs to agree).
  virtual Result<std::unique_ptr<DeviceAllReduce>> MakeDeviceAllReduce();
  // The ranks that have not yet reached the collective this rank has reached (a barrier, or the
  // part of a shared average it waits for), as far as the backend can tell without asking them;
  // empty when it cannot (Gloo, NCCL). Safe to call from any thread while collectives run: the
  // progress watchdog names a rank whose training thread stopped inside a waiting phase by this.
  virtual std::vector<int> Behind() const { return {}; }
};

// kInvalidArgument unless 0 <= rank < size; `backend` names the caller in the message.
Status CheckGroup(const char* backend, int rank, int size);

// Hang reports. Each rank announces where it runs ("host (address, pid N)") on the group's store after
// connecting. When a collective times out, the ranks that are alive time out in it too and
// report so on the store; NameStalledRanks waits up to `grace` for those reports and returns
// `error` extended with the ranks that never reported, and their hosts: the stalled (SIGSTOP,
// deadlocked) or cut-off ones. Store errors leave `error` as it was.
Status AnnounceRank(Store& store, int rank, const std::string& address);
Status NameStalledRanks(Store& store, int rank, int size, Duration grace, const Status& error);

// A group of one: for a trainer whose gradients go elsewhere (parameter servers).
std::unique_ptr<Communicator> ConnectLocal();

struct GlooOptions {
  int rank = 0;
  int size = 1;
  std::string host = "127.0.0.1";               // the address this rank listens on and announces to peers
  Duration timeout = std::chrono::seconds(60);  // connect and every collective
};

// Connects all ranks in a full mesh, exchanging addresses through `store` (keys are namespaced by
// the caller, for example per round). Does not keep `store`.
Result<std::unique_ptr<Communicator>> ConnectGloo(Store& store, const GlooOptions& options);

// Shared memory, for ranks that are all on one host: collectives are memory copies and sums in a
// segment every rank maps, with futex wake-ups, so no socket, no I/O thread and no system call on
// the data path. Rank 0 creates the segment in /dev/shm and removes its name once all ranks have
// mapped it, so nothing is left behind even if a rank crashes. A peer that exits is noticed
// within about 100 ms (its pid is checked while waiting) and reported as kUnavailable; one that
// stalls gives kTimeout naming it.
struct ShmOptions {
  int rank = 0;
  int size = 1;
  Duration timeout = std::chrono::seconds(60);
  size_t chunk_bytes = 4 << 20;  // per rank: larger collectives go through in chunks
};
Result<std::unique_ptr<Communicator>> ConnectShm(Store& store, const ShmOptions& options);

// NCCL, for buffers on NVIDIA GPUs, one GPU per rank (NCCL refuses two ranks on one GPU). Buffers
// may also be host memory (they are staged through the GPU), so small headers and counts need no
// special path. Rank 0 publishes the NCCL id on `store`. Connect and every collective give up
// after `timeout` (kTimeout) and abort the communicator; a peer's failure that NCCL detects
// first gives kUnavailable. Compiled only where CUDA and NCCL were found at build time; elsewhere
// NcclAvailable() is false and ConnectNccl returns kInvalidArgument saying so.
struct NcclOptions {
  int rank = 0;
  int size = 1;
  int device = 0;  // CUDA device ordinal of this rank's GPU
  Duration timeout = std::chrono::seconds(60);
};
bool NcclAvailable();
Result<std::unique_ptr<Communicator>> ConnectNccl(Store& store, const NcclOptions& options);

}  // namespace trainctl::comm
