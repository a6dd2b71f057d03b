// Network addresses as users write them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace trainctl {

// Parses "host:port" (or "[v6]:port").
Status ParseHostPort(const std::string& text, std::string* host, uint16_t* port);
// Parses "etcd://host:port[,host:port...]" into its "host:port" endpoints.
Result<std::vector<std::string>> ParseEtcdUrl(const std::string& url);

}  // namespace trainctl
