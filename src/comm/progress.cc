#include "comm/progress.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "common/log.h"
#include "common/strings.h"

namespace trainctl::comm {
namespace {

std::string ProgressKey(int rank) { return "rank/" + std::to_string(rank) + "/progress"; }
std::string HostKey(int rank) { return "rank/" + std::to_string(rank) + "/host"; }  // AnnounceRank's

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

bool Waiting(Phase p) { return p == Phase::kGradients || p == Phase::kCollective; }
bool Computing(Phase p) { return p == Phase::kForward || p == Phase::kBackward || p == Phase::kApply; }

std::string Seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f s", s);
  return buf;
}

}  // namespace

const char* PhaseName(Phase p) {
  switch (p) {
    case Phase::kStarting:
      return "starting";
    case Phase::kData:
      return "loading data";
    case Phase::kForward:
      return "the forward pass";
    case Phase::kBackward:
      return "the backward pass";
    case Phase::kGradients:
      return "the gradient exchange";
    case Phase::kApply:
      return "the optimizer step";
    case Phase::kCollective:
      return "a collective";
    case Phase::kCheckpoint:
      return "saving a checkpoint";
    case Phase::kEvaluating:
      return "evaluating";
    case Phase::kRecording:
      return "recording the step timeline";
  }
  return "?";
}

ProgressWatchdog::ProgressWatchdog(std::unique_ptr<Store> store, ProgressOptions options,
                                   std::function<void(const Status&)> on_stall)
    : store_(std::move(store)),
      o_(options),
      on_stall_(std::move(on_stall)),
      since_ns_(NowNs()),
      seen_(static_cast<size_t>(std::max(1, options.size))) {
  thread_ = std::thread([this] { Loop(); });
}

ProgressWatchdog::~ProgressWatchdog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void ProgressWatchdog::Enter(Phase phase) {
  if (phase_.load(std::memory_order_relaxed) == static_cast<int>(phase)) return;
  since_ns_.store(NowNs(), std::memory_order_relaxed);
  phase_.store(static_cast<int>(phase), std::memory_order_release);
}

void ProgressWatchdog::StepDone(double seconds) {
  steps_.fetch_add(1, std::memory_order_relaxed);
  const auto ns = static_cast<int64_t>(seconds * 1e9);
  if (ns > slowest_ns_.load(std::memory_order_relaxed)) slowest_ns_.store(ns, std::memory_order_relaxed);
}

void ProgressWatchdog::Loop() {
  Clock::time_point published{};
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (wake_.wait_for(lock, o_.poll, [this] { return stop_; })) return;
    }
    const auto phase = static_cast<Phase>(phase_.load(std::memory_order_acquire));
    const Duration in_phase =
        std::chrono::duration_cast<Duration>(std::chrono::nanoseconds(NowNs() - since_ns_.load()));
    const auto now = Clock::now();
    if (in_phase >= o_.publish_after && now - published >= o_.publish_after) {
      // "PHASE SECONDS STEPS": what this rank is doing, for how long, after how many steps.
      std::ostringstream record;
      record << static_cast<int>(phase) << ' ' << std::chrono::duration<double>(in_phase).count() << ' '
             << steps_.load();
      if (store_->Set(ProgressKey(o_.rank), record.str()).ok()) published = now;
    }
    if (!Waiting(phase) || steps_.load() < o_.min_steps) continue;
    const auto slowest = std::chrono::duration_cast<Duration>(std::chrono::nanoseconds(slowest_ns_.load() * 10));
    const Duration bound = std::max(slowest, o_.floor);
    if (bound >= o_.limit) continue;  // the collective's own timeout comes first, and names the rank
    std::string why;
    if (in_phase < bound || !Investigate(bound, &why)) continue;
    on_stall_(Timeout("no training step for " + Seconds(std::chrono::duration<double>(in_phase).count()) +
                      " (the bound: 10x the slowest step so far, at least " + FormatDuration(o_.floor) + "): " + why));
    return;
  }
}

bool ProgressWatchdog::Investigate(Duration bound, std::string* why) {
  std::vector<std::string> keys;
  for (int r = 0; r < o_.size; ++r) keys.push_back(ProgressKey(r));
  auto records = store_->TryGetMany(keys);
  if (!records.ok()) return false;  // the store is the agent's: its loss is reported there
  const auto now = Clock::now();
  const Duration stale = 3 * o_.publish_after;
  const std::vector<int> behind = o_.behind ? o_.behind() : std::vector<int>{};
  std::vector<std::pair<int, std::string>> stuck;
  for (int r = 0; r < o_.size; ++r) {
    if (r == o_.rank) continue;
    const std::string record = (*records)[r].value_or("");
    Seen& s = seen_[r];
    if (s.since == Clock::time_point{} || s.record != record) s = {record, now};
    int phase = -1;
    double seconds = 0;
    long long steps = 0;
    const bool fresh = !record.empty() && now - s.since < stale;
    if (fresh && std::sscanf(record.c_str(), "%d %lf %lld", &phase, &seconds, &steps) == 3) {
      const auto p = static_cast<Phase>(phase);
      const bool late = std::find(behind.begin(), behind.end(), r) != behind.end();
      if (Waiting(p) && !late) continue;
      if (!Waiting(p) && !Computing(p)) return false;  // loading, saving, evaluating: slow by nature; wait for it
      if (seconds < std::chrono::duration<double>(bound).count()) return false;  // it may yet arrive
      stuck.push_back({r, "in " + std::string(PhaseName(p)) + " for " + Seconds(seconds) + ", after " +
                              std::to_string(steps) + " steps" +
                              (Waiting(p) ? ", and has not reached the collective the others wait in" : "")});
    } else if (now - s.since >= stale) {
      stuck.push_back({r, record.empty() ? "no progress reported" : "its progress reports stopped"});
    } else {
      return false;  // not watched long enough to tell
    }
  }
  if (stuck.empty()) return false;  // every rank waits: calls in different orders, the collective says so
  std::vector<std::string> names;
  for (const auto& [r, what] : stuck) {
    auto host = store_->TryGet(HostKey(r));
    names.push_back("rank " + std::to_string(r) + (host.ok() && host->has_value() ? " on " + **host : "") + " is " +
                    (what.rfind("in ", 0) == 0 ? "stuck " : "stalled or unreachable: ") + what);
  }
  *why = Join(names, "; ");
  return true;
}

}  // namespace trainctl::comm
