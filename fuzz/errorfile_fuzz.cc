// libFuzzer target: a task's error file (TORCHELASTIC_ERROR_FILE), as the agent reads it after a
// failure. Whatever it holds, parsing returns a message or an error; a parsed one writes back to
// the same message.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "job/error_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace trainctl;
  auto e = ParseErrorFile(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz.json");
  if (!e.ok()) return 0;
  auto again = ParseErrorFile(ErrorFileJson(*e), "again.json");
  if (!again.ok() || again->message != e->message || again->traceback != e->traceback) std::abort();
  return 0;
}
