// Plugins: the parts of trainctl that need heavy libraries live in shared objects loaded only by
// the code that uses them, so that every other process (an agent, a CLI verb) starts without
// paying for them: trainctl-torch.so (LibTorch: the trainer, eval, predict) and trainctl-http.so
// (the etcd store's client, on cpp-httplib with OpenSSL; the dashboard and the agents' /metrics).
// They are built from the same sources as the binary, so C++ types cross their entry points.
#pragma once

#include <string>

#include "common/status.h"

namespace trainctl {

inline constexpr const char* kTorchPlugin = "trainctl-torch.so";
inline constexpr const char* kHttpPlugin = "trainctl-http.so";

// The address of `symbol` in plugin `file`, loaded on first use and kept loaded until exit.
// Looked for beside the trainctl binary, then in ../lib/trainctl/ (where `scripts/dev bundle`
// puts it), and, for a binary in the build tree (the tests), where the build wrote it.
// Thread-safe. kNotFound naming each place looked in and what the loader said.
Result<void*> PluginSymbol(const std::string& file, const std::string& symbol);

// PluginSymbol as a function pointer of type F.
template <typename F>
Result<F> PluginFunction(const std::string& file, const std::string& symbol) {
  ASSIGN_OR_RETURN(void* address, PluginSymbol(file, symbol));
  return reinterpret_cast<F>(address);
}

}  // namespace trainctl
