// Store: the key-value store that agents rendezvous and coordinate on (c10d's Store, in C++ with
// Status instead of exceptions). Backends: memory/ (one process, tests), tcp/ (embedded server
// with token auth, the default), etcd/ (issue 4).
//
// Thread safety: every implementation is safe to call from several threads.
// Timeouts: every call that can wait takes a timeout and returns kTimeout when it passes; calls
// that do not wait still fail with kUnavailable, never hang, when the server goes away.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/duration.h"
#include "common/status.h"

namespace trainctl {

class Store {
 public:
  virtual ~Store() = default;

  virtual Status Set(const std::string& key, const std::string& value) = 0;
  // Waits until `key` exists, up to `timeout`, and returns its value.
  virtual Result<std::string> Get(const std::string& key, Duration timeout) = 0;
  // The value if the key exists now, std::nullopt if not; never waits.
  virtual Result<std::optional<std::string>> TryGet(const std::string& key) = 0;
  // Adds `delta` to the integer at `key` (absent counts as 0) and returns the new value.
  // kInvalidArgument if the existing value is not an integer.
  virtual Result<int64_t> Add(const std::string& key, int64_t delta) = 0;
  // If the current value equals `expected` (an absent key equals ""), sets `desired`.
  // Returns the value after the call: `desired` when this caller won.
  virtual Result<std::string> CompareSet(const std::string& key, const std::string& expected,
                                         const std::string& desired) = 0;
  // Waits until all `keys` exist, up to `timeout`.
  virtual Status Wait(const std::vector<std::string>& keys, Duration timeout) = 0;
  // Returns whether the key existed.
  virtual Result<bool> Delete(const std::string& key) = 0;
  // Sets each pair in order: a waiter on a later key finds every earlier one set. Stops at the
  // first error. The TCP store sends them in one go (one round trip, not one per key); this
  // default sets them one by one.
  virtual Status MultiSet(const std::vector<std::pair<std::string, std::string>>& pairs);
  // TryGet of each key, in one call (what a polling agent reads each turn); the TCP store reads
  // them in one round trip, this default one by one.
  virtual Result<std::vector<std::optional<std::string>>> TryGetMany(const std::vector<std::string>& keys);
  // Waits until any of `keys` exists, up to `timeout`: the first in `keys` that exists, by its
  // index, and its value (an agent waits for the round to close or the job to stop, in one
  // call). The TCP store waits on the server, which answers as one is set; this default polls.
  virtual Result<std::pair<size_t, std::string>> WaitAny(const std::vector<std::string>& keys, Duration timeout);
};

// "timeout: waiting for store keys a, b (gave up after 5s)"; with `any`, "for any of store keys".
Status KeysTimeout(const std::vector<std::string>& keys, Duration timeout, bool any = false);

// Namespaces every key under `prefix` (for example "/trainctl/<run-id>/"), so that jobs, runs and
// rounds never see each other's keys. Does not own `base` unless constructed with a unique_ptr.
class PrefixStore : public Store {
 public:
  PrefixStore(Store* base, std::string prefix) : base_(base), prefix_(std::move(prefix)) {}
  PrefixStore(std::unique_ptr<Store> base, std::string prefix)
      : owned_(std::move(base)), base_(owned_.get()), prefix_(std::move(prefix)) {}

  Status Set(const std::string& key, const std::string& value) override;
  Result<std::string> Get(const std::string& key, Duration timeout) override;
  Result<std::optional<std::string>> TryGet(const std::string& key) override;
  Result<int64_t> Add(const std::string& key, int64_t delta) override;
  Result<std::string> CompareSet(const std::string& key, const std::string& expected,
                                 const std::string& desired) override;
  Status Wait(const std::vector<std::string>& keys, Duration timeout) override;
  Result<bool> Delete(const std::string& key) override;
  Status MultiSet(const std::vector<std::pair<std::string, std::string>>& pairs) override;
  Result<std::vector<std::optional<std::string>>> TryGetMany(const std::vector<std::string>& keys) override;
  Result<std::pair<size_t, std::string>> WaitAny(const std::vector<std::string>& keys, Duration timeout) override;

  // Once a call finds the store gone (kUnavailable), every later call fails at once with that
  // status instead of waiting out the store's own timeouts again (a launcher writing its report).
  void FailFastOnceLost() { fail_fast_ = true; }

 private:
  template <typename T, typename F>
  T Call(F&& f);

  std::unique_ptr<Store> owned_;
  Store* base_;
  std::string prefix_;
  bool fail_fast_ = false;
  std::mutex mu_;
  Status lost_;
};

}  // namespace trainctl
