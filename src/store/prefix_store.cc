#include <thread>

#include "common/strings.h"
#include "store/store.h"

namespace trainctl {

Status Store::MultiSet(const std::vector<std::pair<std::string, std::string>>& pairs) {
  for (const auto& [key, value] : pairs) RETURN_IF_ERROR(Set(key, value));
  return Status::Ok();
}

Result<std::vector<std::optional<std::string>>> Store::TryGetMany(const std::vector<std::string>& keys) {
  std::vector<std::optional<std::string>> values;
  values.reserve(keys.size());
  for (const auto& key : keys) {
    ASSIGN_OR_RETURN(auto value, TryGet(key));
    values.push_back(std::move(value));
  }
  return values;
}

Status KeysTimeout(const std::vector<std::string>& keys, Duration timeout, bool any) {
  return Timeout(std::string("waiting for ") + (any && keys.size() > 1 ? "any of " : "") + "store key" +
                 (keys.size() > 1 ? "s " : " ") + Join(keys, ", ") + " (gave up after " + FormatDuration(timeout) +
                 ")");
}

Result<std::pair<size_t, std::string>> Store::WaitAny(const std::vector<std::string>& keys, Duration timeout) {
  if (keys.empty()) return InvalidArgument("WaitAny needs a key");
  const auto deadline = Clock::now() + timeout;
  for (Duration pause(10);; pause = std::min<Duration>(pause * 2, std::chrono::milliseconds(500))) {
    ASSIGN_OR_RETURN(auto values, TryGetMany(keys));
    for (size_t i = 0; i < values.size(); ++i) {
      if (values[i]) return std::make_pair(i, std::move(*values[i]));
    }
    if (Clock::now() >= deadline) return KeysTimeout(keys, timeout, true);
    std::this_thread::sleep_for(std::min(pause, Remaining(deadline)));
  }
}

template <typename T, typename F>
T PrefixStore::Call(F&& f) {
  if (fail_fast_) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!lost_.ok()) return T(lost_);
  }
  T result = f();
  // (kTimeout is a wait that ended, not a store that is gone.)
  if (fail_fast_ && !result.ok() && result.status().code() == Code::kUnavailable) {
    std::lock_guard<std::mutex> lock(mu_);
    lost_ = result.status();
  }
  return result;
}

namespace {
// Status has no status(); give it one, so Call treats both alike.
struct StatusResult {
  Status st;
  StatusResult(Status s) : st(std::move(s)) {}  // NOLINT
  bool ok() const { return st.ok(); }
  const Status& status() const { return st; }
};
}  // namespace

Status PrefixStore::Set(const std::string& key, const std::string& value) {
  return Call<StatusResult>([&] { return StatusResult(base_->Set(prefix_ + key, value)); }).st;
}
Result<std::string> PrefixStore::Get(const std::string& key, Duration timeout) {
  return Call<Result<std::string>>([&] { return base_->Get(prefix_ + key, timeout); });
}
Result<std::optional<std::string>> PrefixStore::TryGet(const std::string& key) {
  return Call<Result<std::optional<std::string>>>([&] { return base_->TryGet(prefix_ + key); });
}
Result<int64_t> PrefixStore::Add(const std::string& key, int64_t delta) {
  return Call<Result<int64_t>>([&] { return base_->Add(prefix_ + key, delta); });
}
Result<std::string> PrefixStore::CompareSet(const std::string& key, const std::string& expected,
                                            const std::string& desired) {
  return Call<Result<std::string>>([&] { return base_->CompareSet(prefix_ + key, expected, desired); });
}
Status PrefixStore::Wait(const std::vector<std::string>& keys, Duration timeout) {
  std::vector<std::string> full;
  full.reserve(keys.size());
  for (const auto& k : keys) full.push_back(prefix_ + k);
  return Call<StatusResult>([&] { return StatusResult(base_->Wait(full, timeout)); }).st;
}
Status PrefixStore::MultiSet(const std::vector<std::pair<std::string, std::string>>& pairs) {
  std::vector<std::pair<std::string, std::string>> full;
  full.reserve(pairs.size());
  for (const auto& [key, value] : pairs) full.emplace_back(prefix_ + key, value);
  return Call<StatusResult>([&] { return StatusResult(base_->MultiSet(full)); }).st;
}
Result<std::vector<std::optional<std::string>>> PrefixStore::TryGetMany(const std::vector<std::string>& keys) {
  std::vector<std::string> full;
  full.reserve(keys.size());
  for (const auto& k : keys) full.push_back(prefix_ + k);
  return Call<Result<std::vector<std::optional<std::string>>>>([&] { return base_->TryGetMany(full); });
}
Result<std::pair<size_t, std::string>> PrefixStore::WaitAny(const std::vector<std::string>& keys, Duration timeout) {
  std::vector<std::string> full;
  full.reserve(keys.size());
  for (const auto& k : keys) full.push_back(prefix_ + k);
  return Call<Result<std::pair<size_t, std::string>>>([&] { return base_->WaitAny(full, timeout); });
}
Result<bool> PrefixStore::Delete(const std::string& key) {
  return Call<Result<bool>>([&] { return base_->Delete(prefix_ + key); });
}

}  // namespace trainctl
