#include "store/store.h"

namespace trainctl {

Status PrefixStore::Set(const std::string& key, const std::string& value) {
  return base_->Set(prefix_ + key, value);
}
Result<std::string> PrefixStore::Get(const std::string& key, Duration timeout) {
  return base_->Get(prefix_ + key, timeout);
}
Result<std::optional<std::string>> PrefixStore::TryGet(const std::string& key) {
  return base_->TryGet(prefix_ + key);
}
Result<int64_t> PrefixStore::Add(const std::string& key, int64_t delta) {
  return base_->Add(prefix_ + key, delta);
}
Result<std::string> PrefixStore::CompareSet(const std::string& key, const std::string& expected,
                                            const std::string& desired) {
  return base_->CompareSet(prefix_ + key, expected, desired);
}
Status PrefixStore::Wait(const std::vector<std::string>& keys, Duration timeout) {
  std::vector<std::string> full;
  full.reserve(keys.size());
  for (const auto& k : keys) full.push_back(prefix_ + k);
  return base_->Wait(full, timeout);
}
Result<bool> PrefixStore::Delete(const std::string& key) { return base_->Delete(prefix_ + key); }

}  // namespace trainctl
