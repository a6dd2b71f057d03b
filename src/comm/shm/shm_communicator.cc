// Shared-memory collectives. Layout of the segment:
//   Control (one cache line per rank: its pid and barrier sequence number; a shared bell word)
//   slots[size][chunk]   each rank's input for the current chunk
//   result[chunk]        the reduced chunk, written in parts: rank r sums part r
// AllReduce of one chunk: copy in, barrier, sum my part of every slot into result, barrier,
// copy result out. Every element is summed by one rank in rank order, so all ranks get the same
// bits. The next chunk's copy-in only touches this rank's slot, which no one reads after the
// second barrier; result is rewritten only after the next first barrier, by which time every
// rank has copied it out.
//
// A SharedAverage has a segment of its own: AverageControl (a block counter shared by all, and
// per rank the blocks of its input it has posted), two sets of inputs[size][stride] used in
// turn, and result[stride]. Each rank writes its input in place (a trainer's backward
// accumulates gradients there) and posts the blocks that are final. In Average() the ranks claim
// blocks in order from the counter, each once every rank has posted it, average them into
// result and zero the inputs they read, and meet at a barrier. Every block was averaged before
// that barrier, so inputs could be rewritten right after it; the sets alternate so that a whole
// call passes before a set is written again (chosen when the trainer still zeroed its own input at
// the start of a step: 66-100 us instead of up to ~200, traced for 1.7 MB). A block of result is
// rewritten only once every rank has posted it in the next call, which each rank does after it is
// done with the last result.
#include <fcntl.h>
#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "comm/communicator.h"
#include "comm/shm/segment.h"
#include "common/cpus.h"
#include "common/random.h"

namespace trainctl::comm {
namespace {

constexpr uint32_t kMagic = 0x74636d73;  // "tcms"
constexpr Duration kSpin = std::chrono::milliseconds(1);
// The most of /dev/shm a SharedAverage takes (two sets of inputs and the result, all ranks).
constexpr size_t kMaxAverageBytes = size_t{1} << 30;

constexpr int kMaskWords = CPU_SETSIZE / 64;

struct alignas(64) RankState {
  std::atomic<uint32_t> seq;  // barriers this rank has entered
  std::atomic<int32_t> pid;
  uint64_t cpus[kMaskWords];  // its affinity mask, written before it counts itself mapped
};

// A rank's affinity mask as its CPU numbers.
std::vector<int> MaskCpus(const uint64_t (&words)[kMaskWords]) {
  std::vector<int> cpus;
  for (int c = 0; c < kMaskWords * 64; ++c) {
    if (words[c / 64] >> (c % 64) & 1) cpus.push_back(c);
  }
  return cpus;
}

struct Control {
  uint32_t magic;
  int32_t size;
  uint64_t chunk_floats;
  alignas(64) std::atomic<uint32_t> bell;    // bumped on every arrival; waiters sleep on it
  alignas(64) std::atomic<uint32_t> mapped;  // ranks that have mapped the segment
  RankState ranks[];                         // size of them
};

size_t ControlBytes(int size) { return (sizeof(Control) + size * sizeof(RankState) + 63) / 64 * 64; }

// Stays in L1 while every rank's input is added to it.
constexpr size_t kAverageBlock = 4096;

// out[i] = (in[i] + in[stride + i] + ...) / size for i < len, added in rank order; then the
// inputs are zeroed for their next use, while their lines are in this core's cache. Whole blocks
// have a constant length and no pointer aliases another, so the compiler vectorizes them.
void AverageBlock(float* __restrict in, size_t stride, int size, size_t len, float* __restrict out) {
  const float n = float(size);
  if (len != kAverageBlock) {
    for (size_t i = 0; i < len; ++i) {
      float sum = in[i];
      for (int r = 1; r < size; ++r) sum += in[r * stride + i];
      out[i] = sum / n;
    }
  } else {
    const float* __restrict second = in + stride;
    for (size_t i = 0; i < kAverageBlock; ++i) out[i] = in[i] + second[i];
    for (int r = 2; r < size; ++r) {
      const float* __restrict next = in + r * stride;
      for (size_t i = 0; i < kAverageBlock; ++i) out[i] += next[i];
    }
    for (size_t i = 0; i < kAverageBlock; ++i) out[i] /= n;
  }
  for (int r = 0; r < size; ++r) std::memset(in + r * stride, 0, len * sizeof(float));
}

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

long Futex(std::atomic<uint32_t>* addr, int op, uint32_t value, const timespec* timeout) {
  return ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(addr), op, value, timeout, nullptr, 0);
}

class ShmAverage;
struct AverageControl;

class ShmCommunicator : public Communicator {
 public:
  ShmCommunicator(int rank, int size, Duration timeout, void* base, size_t bytes, bool spin)
      : rank_(rank), size_(size), timeout_(timeout), base_(base), bytes_(bytes), spin_(spin) {
    control_ = static_cast<Control*>(base);
    chunk_ = control_->chunk_floats;
    slots_ = reinterpret_cast<float*>(static_cast<char*>(base) + ControlBytes(size));
    result_ = slots_ + size_t(size) * chunk_;
    seq_ = control_->ranks[rank].seq.load();
  }
  ~ShmCommunicator() override { ::munmap(base_, bytes_); }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  Status AllReduceSum(float* data, size_t count) override {
    if (size_ == 1) return Status::Ok();
    RETURN_IF_ERROR(Usable());
    for (size_t off = 0; off < count; off += chunk_) {
      size_t n = std::min(chunk_, count - off);
      std::memcpy(slot(rank_), data + off, n * sizeof(float));
      RETURN_IF_ERROR(Arrive("allreduce"));
      size_t begin = n * rank_ / size_, end = n * (rank_ + 1) / size_;
      float* out = result_ + begin;
      std::memcpy(out, slot(0) + begin, (end - begin) * sizeof(float));
      for (int r = 1; r < size_; ++r) {
        const float* in = slot(r) + begin;
        for (size_t i = 0; i < end - begin; ++i) out[i] += in[i];
      }
      RETURN_IF_ERROR(Arrive("allreduce"));
      std::memcpy(data + off, result_, n * sizeof(float));
    }
    return Status::Ok();
  }

  Status Broadcast(void* data, size_t bytes, int root) override {
    if (size_ == 1 || bytes == 0) return Status::Ok();
    RETURN_IF_ERROR(Usable());
    const size_t chunk_bytes = chunk_ * sizeof(float);
    auto* p = static_cast<char*>(data);
    for (size_t off = 0; off < bytes; off += chunk_bytes) {
      size_t n = std::min(chunk_bytes, bytes - off);
      // The first barrier also guarantees everyone has finished reading the previous result.
      RETURN_IF_ERROR(Arrive("broadcast"));
      if (rank_ == root) std::memcpy(result_, p + off, n);
      RETURN_IF_ERROR(Arrive("broadcast"));
      if (rank_ != root) std::memcpy(p + off, result_, n);
    }
    return Status::Ok();
  }

  Status Barrier() override {
    if (size_ == 1) return Status::Ok();
    RETURN_IF_ERROR(Usable());
    return Arrive("barrier");
  }

  Result<std::unique_ptr<SharedAverage>> MakeSharedAverage(size_t count) override;

  // Ranks behind this one: in barriers entered, or in the blocks of a shared average posted.
  std::vector<int> Behind() const override;

 private:
  float* slot(int r) { return slots_ + size_t(r) * chunk_; }

  Status Usable() const { return broken_.empty() ? Status::Ok() : Unavailable("communicator is broken: " + broken_); }

  // Enters the next barrier and waits for every rank to enter it too.
  Status Arrive(const char* what) {
    ++seq_;
    control_->ranks[rank_].seq.store(seq_, std::memory_order_release);
    Ring();
    return Wait(what, [&](std::vector<int>& missing) {
      for (int r = 0; r < size_; ++r) {
        // Wrap-safe: the peer has entered barrier seq_ or a later one.
        if (int32_t(seq_ - control_->ranks[r].seq.load(std::memory_order_acquire)) > 0) missing.push_back(r);
      }
    });
  }

  // Wakes the ranks that sleep in Wait(): call after publishing progress.
  void Ring() {
    control_->bell.fetch_add(1, std::memory_order_acq_rel);
    Futex(&control_->bell, FUTEX_WAKE, INT32_MAX, nullptr);
  }

  // Waits until find_missing(&ranks) leaves `ranks` empty (the ranks this one still waits for).
  // Peers doing the same work arrive within microseconds to a millisecond of each other: when
  // every rank has a CPU of its own (their affinity masks, one for all or one each with
  // cpu_bind: cores, and a container's CPU quota, which spinning would spend) it spins that long
  // (waking from the futex costs ~0.1 ms in a VM), then sleeps on the bell. A missing peer that
  // exited breaks the communicator within about 100 ms; one that stays away past the timeout
  // too, named.
  template <class FindMissing>
  Status Wait(const char* what, FindMissing find_missing) {
    std::vector<int> missing;
    auto missing_now = [&] {
      missing.clear();
      find_missing(missing);
      return !missing.empty();
    };
    auto spin_until = Clock::now() + (spin_ ? kSpin : Duration::zero());
    while (Clock::now() < spin_until) {
      if (!missing_now()) return Status::Ok();
      CpuRelax();
    }
    auto deadline = Clock::now() + timeout_;
    auto next_liveness_check = Clock::now() + std::chrono::milliseconds(100);
    int spins = 0;
    while (true) {
      uint32_t bell = control_->bell.load(std::memory_order_acquire);
      if (!missing_now()) return Status::Ok();
      if (++spins < 200) continue;  // a peer a few microseconds behind: no need to sleep
      auto now = Clock::now();
      if (now >= next_liveness_check) {
        next_liveness_check = now + std::chrono::milliseconds(100);
        for (int r : missing) {
          int32_t pid = control_->ranks[r].pid.load();
          if (pid > 0 && ::kill(pid, 0) != 0 && errno == ESRCH) {
            return Broken(Unavailable(std::string(what) + " failed on rank " + std::to_string(rank_) + ": rank " +
                                      std::to_string(r) + " (pid " + std::to_string(pid) + ") exited"));
          }
        }
      }
      if (now >= deadline) {
        std::string ranks;
        for (int r : missing) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
        return Broken(Timeout(std::string(what) + " timed out on rank " + std::to_string(rank_) + " after " +
                              FormatDuration(timeout_) + ": rank(s) " + ranks + " did not arrive (stalled or stuck)"));
      }
      timespec slice{0, 50 * 1000 * 1000};  // wake up for the liveness and deadline checks
      Futex(&control_->bell, FUTEX_WAIT, bell, &slice);
    }
  }

  friend class ShmAverage;

  Status Broken(Status st) {
    broken_ = st.message();
    return st;
  }

  int rank_, size_;
  Duration timeout_;
  void* base_;
  size_t bytes_;
  Control* control_;
  size_t chunk_;
  float* slots_;
  float* result_;
  uint32_t seq_ = 0;
  const bool spin_;  // every rank has a CPU of its own: a waiting rank spins before it sleeps
  std::string broken_;
  mutable std::mutex averages_mu_;               // guards averages_ (Behind() reads from another thread)
  std::vector<const AverageControl*> averages_;  // the live ShmAverages' heads
};

// The head of a SharedAverage's segment; the inputs and the result follow it.
struct AverageControl {
  alignas(64) std::atomic<uint64_t> next;  // the next block to average, counted over all calls
  struct alignas(64) Posted {
    std::atomic<uint64_t> blocks;  // the blocks of its input a rank has posted, over all calls
  } posted[];                      // one per rank
};

size_t AverageControlBytes(int size) {
  return (sizeof(AverageControl) + size * sizeof(AverageControl::Posted) + 63) / 64 * 64;
}

std::vector<int> ShmCommunicator::Behind() const {
  std::vector<int> behind;
  const uint32_t mine = control_->ranks[rank_].seq.load(std::memory_order_acquire);
  std::lock_guard<std::mutex> lock(averages_mu_);
  for (int r = 0; r < size_; ++r) {
    bool late = int32_t(mine - control_->ranks[r].seq.load(std::memory_order_acquire)) > 0;
    for (const AverageControl* a : averages_) {
      late |=
          a->posted[r].blocks.load(std::memory_order_acquire) < a->posted[rank_].blocks.load(std::memory_order_acquire);
    }
    if (late) behind.push_back(r);
  }
  return behind;
}

// Blocks of kAverageBlock floats are averaged by whichever rank claims them first (a shared
// counter), once every rank has posted them. A rank that finishes backward early thus averages
// the blocks its peers posted while they still compute, and the last rank to arrive finds little
// left. Each block is added in rank order, whoever adds it: every rank gets the same bits.
class ShmAverage : public SharedAverage {
 public:
  ShmAverage(ShmCommunicator* comm, void* base, size_t bytes, size_t count, size_t stride)
      : comm_(comm),
        base_(base),
        bytes_(bytes),
        count_(count),
        stride_(stride),
        blocks_((count + kAverageBlock - 1) / kAverageBlock),
        control_(static_cast<AverageControl*>(base)),
        inputs_(reinterpret_cast<float*>(static_cast<char*>(base) + AverageControlBytes(comm->size()))),
        result_(inputs_ + 2 * comm->size() * stride) {
    std::lock_guard<std::mutex> lock(comm_->averages_mu_);
    comm_->averages_.push_back(control_);
  }
  ~ShmAverage() override {
    {
      std::lock_guard<std::mutex> lock(comm_->averages_mu_);
      std::erase(comm_->averages_, control_);
    }
    ::munmap(base_, bytes_);
  }

  float* input() override { return inputs() + comm_->rank() * stride_; }
  const float* result() const override { return result_; }

  void Post(size_t ready) override {
    uint64_t blocks = ready >= count_ ? blocks_ : ready / kAverageBlock;
    if (blocks <= posted_) return;
    posted_ = blocks;
    control_->posted[comm_->rank()].blocks.store(calls_ * blocks_ + blocks, std::memory_order_release);
    comm_->Ring();
  }

  Status Average() override {
    RETURN_IF_ERROR(comm_->Usable());
    Post(count_);
    const int size = comm_->size();
    const uint64_t first = calls_ * blocks_, end = first + blocks_;
    float* in = inputs();
    uint64_t t = control_->next.load(std::memory_order_acquire);
    while (t < end) {
      const uint64_t i = t - first;
      RETURN_IF_ERROR(comm_->Wait("gradient average", [&](std::vector<int>& missing) {
        for (int r = 0; r < size; ++r) {
          if (control_->posted[r].blocks.load(std::memory_order_acquire) <= first + i) missing.push_back(r);
        }
      }));
      if (!control_->next.compare_exchange_weak(t, t + 1, std::memory_order_acq_rel)) continue;
      const size_t begin = i * kAverageBlock;
      AverageBlock(in + begin, stride_, size, std::min(kAverageBlock, count_ - begin), result_ + begin);
      t = control_->next.load(std::memory_order_acquire);
    }
    ++calls_;
    posted_ = 0;
    // Every block is averaged once every rank is past its loop: inputs and result are final.
    return comm_->Arrive("gradient average");
  }

 private:
  // This call's set of inputs (one per rank).
  float* inputs() const { return inputs_ + (calls_ % 2) * comm_->size() * stride_; }

  ShmCommunicator* comm_;
  void* base_;
  size_t bytes_, count_, stride_;
  uint64_t blocks_;
  AverageControl* control_;
  float* inputs_;  // two sets of `size` inputs
  float* result_;
  uint64_t calls_ = 0;   // Average() calls made
  uint64_t posted_ = 0;  // blocks posted in this call
};

// Rank 0 makes the segment and broadcasts its name (empty: it could not); every rank maps it;
// an allreduce of the failures tells every rank whether all did; then the name goes.
Result<std::unique_ptr<SharedAverage>> ShmCommunicator::MakeSharedAverage(size_t count) {
  if (size_ == 1) return InvalidArgument("shm: one rank needs no shared average");
  RETURN_IF_ERROR(Usable());
  const size_t stride = (std::max<size_t>(count, 1) + 15) / 16 * 16;
  const size_t bytes = AverageControlBytes(size_) + (2 * size_t(size_) + 1) * stride * sizeof(float);
  if (bytes > kMaxAverageBytes) {  // every rank computes the same: no one waits in the broadcast
    return InvalidArgument("shm: a shared average of " + std::to_string(bytes >> 20) +
                           " MiB is more than /dev/shm can be expected to hold");
  }
  char name[64] = {0};
  Status made;
  int fd = -1;
  if (rank_ == 0) {
    std::string n = NewSegmentName();
    auto created = CreateSegment(n, bytes);
    if (created.ok()) {
      fd = *created;
      std::snprintf(name, sizeof name, "%s", n.c_str());
    } else {
      made = created.status();
    }
  }
  auto forget = [&] {
    if (fd >= 0) ::close(fd);
    if (rank_ == 0 && name[0]) ::unlink(name);
  };
  if (Status st = Broadcast(name, sizeof name, 0); !st.ok()) {
    forget();
    return st;
  }
  if (!name[0]) {
    return rank_ == 0 ? made : Unavailable("shm: rank 0 could not make the gradient segment");
  }
  if (rank_ != 0) {
    auto opened = OpenSegment(name, bytes);
    fd = opened.ok() ? *opened : -1;
  }
  void* base = fd < 0 ? MAP_FAILED : ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int err = errno;
  float failed = base == MAP_FAILED ? 1 : 0;
  Status st = AllReduceSum(&failed, 1);
  forget();
  if (st.ok() && failed > 0) {
    st = base == MAP_FAILED ? ErrnoStatus(std::string("shm: cannot map ") + name, err)
                            : Unavailable("shm: a peer could not map the gradient segment");
  }
  if (!st.ok()) {
    if (base != MAP_FAILED) ::munmap(base, bytes);
    return st;
  }
  return std::unique_ptr<SharedAverage>(new ShmAverage(this, base, bytes, count, stride));
}

}  // namespace

Result<std::unique_ptr<Communicator>> ConnectShm(Store& store, const ShmOptions& o) {
  RETURN_IF_ERROR(CheckGroup("shm", o.rank, o.size));
  const size_t chunk = std::max<size_t>(1024, o.chunk_bytes / sizeof(float));
  const size_t bytes = ControlBytes(o.size) + (size_t(o.size) + 1) * chunk * sizeof(float);
  std::string name;
  int fd = -1;
  if (o.rank == 0) {
    name = NewSegmentName();
    ASSIGN_OR_RETURN(fd, CreateSegment(name, bytes));
  } else {
    auto got = store.Get("shm", o.timeout);
    if (!got.ok()) return Unavailable("shm: rank 0 did not publish its segment: " + got.status().ToString());
    name = *got;
    ASSIGN_OR_RETURN(fd, OpenSegment(name, bytes));
  }
  void* base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int err = errno;
  ::close(fd);
  if (base == MAP_FAILED) {
    if (o.rank == 0) ::unlink(name.c_str());
    return ErrnoStatus("shm: cannot map " + name, err);
  }
  auto* control = static_cast<Control*>(base);
  if (o.rank == 0) {
    control->magic = kMagic;
    control->size = o.size;
    control->chunk_floats = chunk;
  }
  control->ranks[o.rank].pid.store(::getpid());
  uint64_t mask[kMaskWords] = {};
  for (int c : AffinityCpus()) mask[c / 64] |= uint64_t{1} << (c % 64);
  std::memcpy(control->ranks[o.rank].cpus, mask, sizeof mask);
  auto cleanup = [&](Status st) -> Result<std::unique_ptr<Communicator>> {
    ::munmap(base, bytes);
    if (o.rank == 0) ::unlink(name.c_str());
    return st;
  };
  if (o.rank == 0) {
    if (Status st = store.Set("shm", name); !st.ok()) return cleanup(st);
  } else if (control->magic != kMagic || control->size != o.size || control->chunk_floats != chunk) {
    return cleanup(InvalidArgument("shm: " + name + " was made for another group"));
  }
  control->mapped.fetch_add(1);
  // Every rank has mapped the segment once the "mapped" count is full; then its name can go.
  auto deadline = Clock::now() + o.timeout;
  while (control->mapped.load() < uint32_t(o.size)) {
    if (Clock::now() > deadline) {
      return cleanup(Timeout("shm: only " + std::to_string(control->mapped.load()) + " of " + std::to_string(o.size) +
                             " ranks mapped the segment in time"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (o.rank == 0) ::unlink(name.c_str());
  std::vector<std::vector<int>> masks;
  for (int r = 0; r < o.size; ++r) masks.push_back(MaskCpus(control->ranks[r].cpus));
  const bool spin = EachHasACpuOfItsOwn(masks, OwnCpuQuota());
  return std::unique_ptr<Communicator>(new ShmCommunicator(o.rank, o.size, o.timeout, base, bytes, spin));
}

}  // namespace trainctl::comm
