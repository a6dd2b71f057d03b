// libFuzzer target: a checkpoint file's bytes, as `trainctl eval` and a resume read them; and the
// same bytes as a TorchScript module file's, whose zip directory is checked before LibTorch sees it.
#include <cstdint>
#include <string>

#include "checkpoint/checkpoint.h"
#include "checkpoint/meta.h"
#include "checkpoint/module_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace trainctl::checkpoint;
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  (void)CheckModuleArchive(bytes, "fuzz.pt");
  auto c = Decode(bytes, "fuzz");
  if (!c.ok()) return 0;
  (void)ReadModelMeta(*c, "fuzz");
  (void)ReadPosition(*c, "fuzz");
  auto again = Encode(*c);  // what decodes must encode again
  if (again.ok()) (void)Decode(*again, "fuzz");
  return 0;
}
