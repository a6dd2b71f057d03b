#include "store/memory/memory_store.h"

#include <charconv>

#include "common/strings.h"

namespace trainctl {

const std::string* KvTable::Find(const std::string& key) const {
  auto it = data_.find(key);
  return it == data_.end() ? nullptr : &it->second;
}

Result<int64_t> KvTable::Add(const std::string& key, int64_t delta) {
  int64_t value = 0;
  if (const std::string* current = Find(key); current && !current->empty()) {
    auto [ptr, ec] = std::from_chars(current->data(), current->data() + current->size(), value);
    if (ec != std::errc() || ptr != current->data() + current->size()) {
      return InvalidArgument("store key " + key + " holds " + Quote(*current) + ", not an integer");
    }
  }
  if (__builtin_add_overflow(value, delta, &value)) {
    return InvalidArgument("store key " + key + ": integer overflow");
  }
  data_[key] = std::to_string(value);
  return value;
}

std::string KvTable::CompareSet(const std::string& key, const std::string& expected, const std::string& desired) {
  const std::string* current = Find(key);
  std::string now = current ? *current : "";
  if (now != expected) return now;
  data_[key] = desired;
  return desired;
}

bool KvTable::HasAll(const std::vector<std::string>& keys) const {
  for (const auto& k : keys) {
    if (!data_.count(k)) return false;
  }
  return true;
}

Status MemoryStore::Set(const std::string& key, const std::string& value) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    table_.Set(key, value);
  }
  changed_.notify_all();
  return Status::Ok();
}

Result<std::string> MemoryStore::Get(const std::string& key, Duration timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!changed_.wait_for(lock, timeout, [&] { return table_.Find(key) != nullptr; })) {
    return KeysTimeout({key}, timeout);
  }
  return *table_.Find(key);
}

Result<std::optional<std::string>> MemoryStore::TryGet(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string* v = table_.Find(key);
  return v ? std::optional<std::string>(*v) : std::nullopt;
}

Result<int64_t> MemoryStore::Add(const std::string& key, int64_t delta) {
  Result<int64_t> r = [&] {
    std::lock_guard<std::mutex> lock(mu_);
    return table_.Add(key, delta);
  }();
  changed_.notify_all();
  return r;
}

Result<std::string> MemoryStore::CompareSet(const std::string& key, const std::string& expected,
                                            const std::string& desired) {
  std::string r;
  {
    std::lock_guard<std::mutex> lock(mu_);
    r = table_.CompareSet(key, expected, desired);
  }
  changed_.notify_all();
  return r;
}

Status MemoryStore::Wait(const std::vector<std::string>& keys, Duration timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  bool ok = changed_.wait_for(lock, timeout, [&] { return table_.HasAll(keys); });
  return ok ? Status::Ok() : KeysTimeout(keys, timeout);
}

Result<bool> MemoryStore::Delete(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  return table_.Erase(key);
}

}  // namespace trainctl
