// libFuzzer target: the manifests' YAML emitter (render/k8s). Any strings, as keys and values,
// read back with a YAML parser as the same strings in the same places: no line break, indicator or
// control byte lets a value write a field of its own.
#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>

#include "common/strings.h"
#include "render/k8s/render.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using nlohmann::json;
  // The bytes, cut at NULs into up to six strings: a key, then values (valid UTF-8 only: what a
  // spec read as YAML holds).
  const std::string all(reinterpret_cast<const char*>(data), size);
  if (!trainctl::IsValidUtf8(all)) return 0;
  std::vector<std::string> parts;
  for (size_t at = 0; parts.size() < 6;) {
    const size_t end = all.find('\0', at);
    parts.push_back(all.substr(at, end == std::string::npos ? std::string::npos : end - at));
    if (end == std::string::npos) break;
    at = end + 1;
  }
  json object = {{"kind", "ConfigMap"}, {"data", json::object()}};
  for (size_t i = 1; i < parts.size(); ++i) object["data"]["v" + std::to_string(i)] = parts[i];
  object["data"][parts[0]] = "key";
  object["list"] = json(parts);
  const std::string text = trainctl::k8s::ToYaml({object});
  YAML::Node read;
  try {
    read = YAML::Load(text);
  } catch (const YAML::Exception&) {
    std::abort();  // what the emitter writes always parses
  }
  if (read.size() != object.size() || read["data"].size() != object["data"].size()) std::abort();
  for (const auto& [k, v] : object["data"].items()) {
    if (!read["data"][k] || read["data"][k].Scalar() != v.get<std::string>()) std::abort();
  }
  for (size_t i = 0; i < parts.size(); ++i) {
    if (read["list"][i].Scalar() != parts[i]) std::abort();
  }
  return 0;
}
