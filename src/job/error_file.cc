#include "job/error_file.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

#include "common/fs.h"
#include "common/strings.h"

namespace trainctl {

namespace {

constexpr size_t kMaxText = 64 << 10;

std::string Cut(std::string text, bool keep_end) {
  if (text.size() <= kMaxText) return text;
  return keep_end ? "…" + text.substr(text.size() - kMaxText) : text.substr(0, kMaxText) + "…";
}

}  // namespace

Result<TaskError> ParseErrorFile(std::string_view bytes, const std::string& path) {
  if (!IsValidUtf8(bytes)) return InvalidArgument(path + ": not UTF-8 text");
  auto j = nlohmann::json::parse(bytes, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return InvalidArgument(path + ": not a JSON object");
  if (!j.contains("message")) return InvalidArgument(path + ": no \"message\" field");
  TaskError e;
  const auto& m = j["message"];
  if (m.is_string()) {
    e.message = Cut(m.get<std::string>(), false);
    return e;
  }
  if (!m.is_object() || !m.contains("message") || !m["message"].is_string()) {
    return InvalidArgument(path + ": \"message\" is neither text nor {\"message\": text, ...}");
  }
  e.message = Cut(m["message"].get<std::string>(), false);
  if (m.contains("extraInfo") && m["extraInfo"].is_object()) {
    const auto& extra = m["extraInfo"];
    if (extra.contains("py_callstack") && extra["py_callstack"].is_string()) {
      e.traceback = Cut(extra["py_callstack"].get<std::string>(), true);
    }
    if (extra.contains("timestamp")) {
      const auto& t = extra["timestamp"];
      if (t.is_number_integer()) {
        e.timestamp = t.get<int64_t>();
      } else if (t.is_string()) {
        const std::string s = t.get<std::string>();
        if (s.empty() || s.size() > 12 || s.find_first_not_of("0123456789") != std::string::npos) {
          return InvalidArgument(path + ": timestamp " + Quote(s) + " is not a number of seconds");
        }
        e.timestamp = std::stoll(s);
      } else {
        return InvalidArgument(path + ": timestamp is not a number of seconds");
      }
    }
  }
  return e;
}

Result<std::optional<TaskError>> ReadErrorFile(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return std::optional<TaskError>();
    return Internal("cannot read " + path + ": " + std::strerror(errno));
  }
  if (!S_ISREG(st.st_mode)) return InvalidArgument(path + ": not a regular file");
  ASSIGN_OR_RETURN(std::string bytes, ReadFile(path, kMaxErrorFileBytes));
  ASSIGN_OR_RETURN(TaskError e, ParseErrorFile(bytes, path));
  // torch writes whole seconds; the file was written in that second, so its time is the finer one.
  constexpr int64_t kNs = 1'000'000'000;
  e.time_ns = e.timestamp * kNs;
  if (e.timestamp > 0 && st.st_mtim.tv_sec == e.timestamp) e.time_ns += st.st_mtim.tv_nsec;
  return std::optional<TaskError>(e);
}

std::string ErrorFileJson(const TaskError& e) {
  return nlohmann::json{{"message",
                         {{"message", e.message},
                          {"extraInfo", {{"py_callstack", e.traceback}, {"timestamp", std::to_string(e.timestamp)}}}}}}
      .dump();
}

}  // namespace trainctl
