#pragma once

#include <string>

namespace trainctl {

// `bytes` random bytes from the kernel (getrandom), as lowercase hex. For tokens and run ids.
std::string RandomHex(size_t bytes);

}  // namespace trainctl
