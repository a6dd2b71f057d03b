#include "common/address.h"

#include <cstdlib>

namespace trainctl {

Status ParseHostPort(const std::string& text, std::string* host, uint16_t* port) {
  size_t colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == text.size()) {
    return InvalidArgument("expected host:port, got \"" + text + "\"");
  }
  std::string h = text.substr(0, colon);
  if (h.size() > 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  char* end = nullptr;
  long p = std::strtol(text.c_str() + colon + 1, &end, 10);
  if (*end != '\0' || p <= 0 || p > 65535) {
    return InvalidArgument("expected a port from 1 to 65535 in \"" + text + "\"");
  }
  *host = h;
  *port = static_cast<uint16_t>(p);
  return Status::Ok();
}

Result<std::vector<std::string>> ParseEtcdUrl(const std::string& url) {
  const std::string scheme = "etcd://";
  const std::string expected = "expected etcd://host:port[,host:port...], got \"" + url + "\"";
  if (url.rfind(scheme, 0) != 0) return InvalidArgument(expected);
  std::vector<std::string> endpoints;
  std::string rest = url.substr(scheme.size());
  size_t start = 0;
  while (start <= rest.size()) {
    size_t comma = rest.find(',', start);
    if (comma == std::string::npos) comma = rest.size();
    std::string endpoint = rest.substr(start, comma - start);
    std::string host;
    uint16_t port;
    if (!ParseHostPort(endpoint, &host, &port).ok()) return InvalidArgument(expected);
    endpoints.push_back(endpoint);
    start = comma + 1;
  }
  return endpoints;
}

}  // namespace trainctl
