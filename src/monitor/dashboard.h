// `trainctl dashboard`: an HTTP server for this user's runs on this machine. A page (assets
// embedded in the binary, nothing from elsewhere) with the jobs, their live curves, workers,
// failures, logs and eval results; a JSON API under /api/; Prometheus metrics at /metrics.
// Every request but the static assets needs the token: `?token=` (the URL it prints, as Jupyter
// does) or `Authorization: Bearer`. Binds 127.0.0.1 unless told otherwise.
#pragma once

#include <memory>
#include <string>

#include "common/status.h"

namespace trainctl::monitor {

struct DashboardOptions {
  std::string host = "127.0.0.1";
  int port = 0;          // 0: any free port
  std::string token;     // required on every data request; "" is refused by Start
  std::string self_exe;  // trainctl, run as `eval` and `predict` for a run's eval results
};

class Dashboard {
 public:
  // Binds and serves on its own threads until destroyed. kUnavailable when it cannot bind.
  static Result<std::unique_ptr<Dashboard>> Start(const DashboardOptions& options);
  ~Dashboard();
  Dashboard(const Dashboard&) = delete;
  Dashboard& operator=(const Dashboard&) = delete;

  int port() const;
  std::string Url() const;  // http://host:port/?token=...

 private:
  struct Impl;
  explicit Dashboard(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace trainctl::monitor
