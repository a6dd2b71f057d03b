// Typed fields of JSON read from files a user may have edited, or another version of trainctl
// written (status.json, metrics.jsonl, job.json, the run index): a field of another type is as if
// missing, where nlohmann's value() would throw and end the command.
#pragma once

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <type_traits>

namespace trainctl {

// `key` of the object `j` as a T (a string, bool, integer or floating-point type), or `fallback`
// when `j` is not an object, lacks `key`, holds another type there, or a number out of T's range.
template <class T>
T JsonField(const nlohmann::json& j, const char* key, T fallback) {
  if (!j.is_object()) return fallback;
  auto it = j.find(key);
  if (it == j.end()) return fallback;
  if constexpr (std::is_same_v<T, std::string>) {
    return it->is_string() ? it->template get<std::string>() : fallback;
  } else if constexpr (std::is_same_v<T, bool>) {
    return it->is_boolean() ? it->template get<bool>() : fallback;
  } else if constexpr (std::is_floating_point_v<T>) {
    return it->is_number() ? static_cast<T>(it->template get<double>()) : fallback;
  } else {
    static_assert(std::is_integral_v<T>, "JsonField reads strings, bools and numbers");
    if (it->is_number_integer()) {
      if (it->is_number_unsigned()) {
        const uint64_t u = it->template get<uint64_t>();
        return u <= static_cast<uint64_t>(std::numeric_limits<T>::max()) ? static_cast<T>(u) : fallback;
      }
      const int64_t i = it->template get<int64_t>();
      return i >= static_cast<int64_t>(std::numeric_limits<T>::min()) &&
                     i <= static_cast<int64_t>(std::numeric_limits<T>::max())
                 ? static_cast<T>(i)
                 : fallback;
    }
    if (!it->is_number_float()) return fallback;
    const double d = it->template get<double>();                         // a whole number written as 3.0
    const double end = std::ldexp(1.0, std::numeric_limits<T>::digits);  // T's max + 1, exactly
    const double least = std::is_signed_v<T> ? -end : 0.0;
    return std::isfinite(d) && d == std::floor(d) && d >= least && d < end ? static_cast<T>(d) : fallback;
  }
}

inline std::string JsonField(const nlohmann::json& j, const char* key, const char* fallback) {
  return JsonField<std::string>(j, key, std::string(fallback));
}

// The JSON document that a command printed after whatever lines came before it (a library's
// warning, such as LibTorch's "[W NNPACK.cpp:64] Could not initialize NNPACK!"): the first line
// that starts with '{' or '[' and from which the rest parses; null when there is none.
inline nlohmann::json JsonAfterOtherLines(const std::string& output) {
  for (size_t at = 0; at < output.size();) {
    if (output[at] == '{' || output[at] == '[') {
      auto j = nlohmann::json::parse(output.begin() + static_cast<long>(at), output.end(), nullptr, false);
      if (!j.is_discarded()) return j;
    }
    const size_t eol = output.find('\n', at);
    if (eol == std::string::npos) break;
    at = eol + 1;
  }
  return nlohmann::json();
}

}  // namespace trainctl
