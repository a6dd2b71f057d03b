// libFuzzer target: what `trainctl bench` reads that others may have written: a matrix file, and
// a result set's results.json (--resume, compare). Whatever the bytes, parsing returns a matrix or
// an error, and experiments read back from JSON aggregate, compare and write back the same.
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>

#include "bench/matrix.h"
#include "bench/results.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace trainctl::bench;
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto m = ParseMatrix(text, "fuzz.yaml");
  if (m.ok() && Points(*m).size() <= 4096) (void)Experiments(*m);
  auto doc = nlohmann::json::parse(text, nullptr, false);
  if (!doc.is_object() || !doc.contains("experiments") || !doc["experiments"].is_array()) return 0;
  std::vector<Figures> runs;
  for (const auto& e : doc["experiments"]) {
    if (!e.is_object()) continue;
    auto f = Figures::FromJson(e);
    if (!f.ok()) continue;
    auto again = Figures::FromJson(f->ToJson());
    if (!again.ok() || again->id != f->id || again->state != f->state || again->point != f->point) std::abort();
    runs.push_back(*f);
  }
  (void)Aggregates(runs);
  int regressions = 0;
  (void)Compare(runs, runs, 0.05, &regressions);
  return 0;
}
