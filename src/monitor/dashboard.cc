#include "monitor/dashboard.h"

#include "common/address.h"
#include "common/plugin.h"
#include "monitor/http_service.h"

namespace trainctl::monitor {

struct Dashboard::Impl {
  DashboardOptions o;
  std::unique_ptr<HttpService> service;
};

Dashboard::Dashboard(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Result<std::unique_ptr<Dashboard>> Dashboard::Start(const DashboardOptions& options) {
  if (options.token.size() < 16) return InvalidArgument("the dashboard's token must be at least 16 characters");
  ASSIGN_OR_RETURN(auto serve, PluginFunction<ServeDashboardEntry>(kHttpPlugin, kServeDashboardEntry));
  ServiceResult service = Unavailable("not started");
  serve(options, &service);
  if (!service.ok()) return service.status();
  auto impl = std::make_unique<Impl>();
  impl->o = options;
  impl->service = std::move(*service);
  return std::unique_ptr<Dashboard>(new Dashboard(std::move(impl)));
}

Dashboard::~Dashboard() = default;

int Dashboard::port() const { return impl_->service->port(); }

std::string Dashboard::Url() const {
  return "http://" + JoinHostPort(impl_->o.host, port()) + "/?token=" + impl_->o.token;
}

}  // namespace trainctl::monitor
