// The monitor's HTTP servers (the dashboard, the agents' /metrics) as the binary sees them: their
// code (on trainctl's own HTTP server, monitor/http_server.h) lives in the plugin trainctl-http.so
// beside the etcd store's cpp-httplib client (common/plugin.h), loaded by the first one started.
// Internal to monitor/.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "common/status.h"

namespace trainctl::monitor {

struct DashboardOptions;

// A server bound to its port and serving on threads of its own until destroyed.
class HttpService {
 public:
  virtual ~HttpService() = default;
  virtual int port() const = 0;
};
using ServiceResult = Result<std::unique_ptr<HttpService>>;

// The plugin's entry points (extern "C", results through `out`).
using ServeMetricsEntry = void (*)(const std::string& host, int port, const std::string& token,
                                   std::function<std::string()> render, ServiceResult* out);
inline constexpr const char* kServeMetricsEntry = "trainctl_serve_metrics";
using ServeDashboardEntry = void (*)(const DashboardOptions& options, ServiceResult* out);
inline constexpr const char* kServeDashboardEntry = "trainctl_serve_dashboard";

}  // namespace trainctl::monitor
