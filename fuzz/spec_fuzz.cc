// libFuzzer target: a job spec's bytes, as `trainctl run` reads them (and as an agent reads a
// resolved spec's JSON); a spec that parses must round-trip through its resolved JSON (which is
// itself a spec).
#include <cstdint>
#include <cstdlib>
#include <string>

#include "jobspec/job_spec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace trainctl;
  const std::string text(reinterpret_cast<const char*>(data), size);
  (void)JobSpecFromJson(text);
  auto spec = ParseJobSpec(text, "fuzz.yaml");
  if (!spec.ok()) return 0;
  const std::string json = JobSpecToJson(*spec);
  auto back = JobSpecFromJson(json);
  if (!back.ok() || JobSpecToJson(*back) != json) std::abort();
  return 0;
}
