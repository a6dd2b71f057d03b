// libFuzzer target: bytes a client sends the job's store (or a parameter server: the same
// frames, common/wire.h), framed and read as the server does.
#include <cstdint>
#include <string>

#include "store/tcp/wire.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace trainctl::wire;
  std::string buf(reinterpret_cast<const char*>(data), size), body;
  for (uint64_t max : {kMaxHelloBytes, kMaxFrameBytes}) {
    std::string in = buf;
    while (TakeFrame(&in, &body, max) == 1) {
      Reader r(body);
      uint8_t op;
      int64_t n;
      std::string s;
      if (!r.U8(&op)) continue;
      while (r.I64(&n) || r.Str(&s)) {
      }
    }
  }
  return 0;
}
