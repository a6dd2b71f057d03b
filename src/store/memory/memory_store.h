// An in-process Store (tests; jobs whose agents share one process), and KvTable, the key-value
// semantics that every backend serves.
#pragma once

#include <condition_variable>
#include <map>
#include <mutex>

#include "store/store.h"

namespace trainctl {

// The data and rules of a store, without locking or waiting. Not thread-safe.
class KvTable {
 public:
  void Set(const std::string& key, const std::string& value) { data_[key] = value; }
  const std::string* Find(const std::string& key) const;
  Result<int64_t> Add(const std::string& key, int64_t delta);
  std::string CompareSet(const std::string& key, const std::string& expected, const std::string& desired);
  bool Erase(const std::string& key) { return data_.erase(key) > 0; }
  bool HasAll(const std::vector<std::string>& keys) const;

 private:
  std::map<std::string, std::string> data_;
};

class MemoryStore : public Store {
 public:
  Status Set(const std::string& key, const std::string& value) override;
  Result<std::string> Get(const std::string& key, Duration timeout) override;
  Result<std::optional<std::string>> TryGet(const std::string& key) override;
  Result<int64_t> Add(const std::string& key, int64_t delta) override;
  Result<std::string> CompareSet(const std::string& key, const std::string& expected,
                                 const std::string& desired) override;
  Status Wait(const std::vector<std::string>& keys, Duration timeout) override;
  Result<bool> Delete(const std::string& key) override;

 private:
  std::mutex mu_;
  std::condition_variable changed_;
  KvTable table_;
};

}  // namespace trainctl
