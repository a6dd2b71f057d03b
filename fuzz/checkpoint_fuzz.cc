// libFuzzer target: a checkpoint file's bytes, as `trainctl eval` and a resume read them.
#include <cstdint>
#include <string>

#include "checkpoint/checkpoint.h"
#include "checkpoint/meta.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace trainctl::checkpoint;
  auto c = Decode(std::string(reinterpret_cast<const char*>(data), size), "fuzz");
  if (!c.ok()) return 0;
  (void)ReadModelMeta(*c, "fuzz");
  (void)ReadPosition(*c, "fuzz");
  auto again = Encode(*c);  // what decodes must encode again
  if (again.ok()) (void)Decode(*again, "fuzz");
  return 0;
}
