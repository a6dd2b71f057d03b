#include "common/random.h"

#include <sys/random.h>

#include <cerrno>
#include <cstdio>
#include <stdexcept>
#include <vector>

namespace trainctl {

std::string RandomHex(size_t bytes) {
  std::vector<unsigned char> buf(bytes);
  size_t got = 0;
  while (got < bytes) {
    ssize_t n = getrandom(buf.data() + got, bytes - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      // The kernel always has getrandom on supported systems; this is an invariant.
      std::perror("getrandom");
      std::abort();
    }
    got += static_cast<size_t>(n);
  }
  static const char* kHex = "0123456789abcdef";
  std::string out;
  for (unsigned char c : buf) {
    out += kHex[c >> 4];
    out += kHex[c & 15];
  }
  return out;
}

}  // namespace trainctl
