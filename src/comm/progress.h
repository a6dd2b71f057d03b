// A progress watchdog for a group of training ranks: names a rank that stops making progress
// within seconds, instead of after the collective timeout (60 s by default).
//
// Each rank's training loop says which phase it is in (Enter: cheap atomic stores) and how long
// each step took (StepDone). A thread per rank publishes the rank's phase on the group's store
// while a phase lasts longer than `publish_after`, so a rank that is quick says nothing. When this
// rank has waited in a collective for the bound — 10x the slowest step it has seen, at least
// `floor` (at `limit` or more the collective's own timeout names the rank instead) — it reads the
// others' records: a rank in a local computing phase
// (forward, backward, the optimizer) for the bound or longer is stuck, as is one that reports a
// waiting phase for that long while the communicator says it has not reached the collective
// (`behind`); a rank that never reported, or stopped reporting, is stalled or unreachable. Ranks in phases that may
// take long by nature (loading data, saving a checkpoint, evaluating) are waited for, up to the collective timeout.
// `on_stall` is then called once, from the watchdog's thread, with the ranks named (host and pid
// from AnnounceRank) and what each was doing; the caller ends the process.
//
// Times crossing hosts are durations measured by their rank, never clock readings.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/duration.h"
#include "common/status.h"
#include "store/store.h"

namespace trainctl::comm {

enum class Phase : int {
  kStarting,    // before the first step: connecting, loading, warming up (slow by nature)
  kData,        // waiting for the next batch (slow by nature: a cold disk, a network filesystem)
  kForward,     // computing
  kBackward,    // computing
  kGradients,   // waiting for the other ranks' gradients (a collective)
  kApply,       // the optimizer (computing; with parameter servers, waiting for them)
  kCollective,  // another collective: the loss for the log, the balance of the batch
  kCheckpoint,  // saving a checkpoint or snapshot (slow by nature)
  kEvaluating,  // evaluating the test set (slow by nature)
  kRecording,   // gathering and writing the step timeline (slow by nature)
};
const char* PhaseName(Phase p);

struct ProgressOptions {
  int rank = 0, size = 1;
  Duration floor = std::chrono::seconds(5);   // the least bound
  Duration limit = std::chrono::seconds(57);  // when the collective gives up anyway
  Duration publish_after = std::chrono::seconds(1);
  Duration poll = std::chrono::milliseconds(250);
  int min_steps = 3;  // steps to measure before the bound holds
  // The ranks that have not reached the collective this rank waits in (Communicator::Behind),
  // asked from the watchdog's thread; null: not known. A rank that reports a waiting phase but is
  // behind, for the bound, has stopped inside it (its training thread frozen, its others alive).
  std::function<std::vector<int>()> behind;
};

class ProgressWatchdog {
 public:
  // `store` is the group's key space (the watchdog's own client: the training loop's is not
  // shared across threads).
  ProgressWatchdog(std::unique_ptr<Store> store, ProgressOptions options, std::function<void(const Status&)> on_stall);
  ~ProgressWatchdog();  // stops the thread at once (not at its next poll: a job's last step waits for it)
  ProgressWatchdog(const ProgressWatchdog&) = delete;
  ProgressWatchdog& operator=(const ProgressWatchdog&) = delete;

  // From the training loop: now in `phase`.
  void Enter(Phase phase);
  // From the training loop: a step is done; it took `seconds`.
  void StepDone(double seconds);

 private:
  void Loop();
  // While this rank has waited `bound` or longer in a collective: the other ranks' state, and
  // whether to give up on them (fills `why`).
  bool Investigate(Duration bound, std::string* why);

  std::unique_ptr<Store> store_;
  const ProgressOptions o_;
  std::function<void(const Status&)> on_stall_;
  std::atomic<int> phase_{static_cast<int>(Phase::kStarting)};
  std::atomic<int64_t> since_ns_;  // steady clock, when the phase began
  std::atomic<int64_t> steps_{0};
  std::atomic<int64_t> slowest_ns_{0};
  std::mutex mu_;  // guards stop_ for the condition
  std::condition_variable wake_;
  bool stop_ = false;
  // What each other rank last published, and since when (this process's clock) it has not changed.
  struct Seen {
    std::string record;
    Clock::time_point since{};
  };
  std::vector<Seen> seen_;
  std::thread thread_;
};

}  // namespace trainctl::comm
