#include "metrics/metrics.h"

#include <unistd.h>

#include <array>
#include <charconv>
#include <cmath>
#include <cstring>
#include <ctime>
#include <nlohmann/json.hpp>

#include "common/address.h"
#include "common/duration.h"
#include "common/fs.h"

namespace trainctl::metrics {
namespace {

std::array<uint32_t, 256> MakeCrcTable() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    t[i] = c;
  }
  return t;
}

// Protocol-buffer wire encoding, just what Event and Summary need.
void Varint(std::string* out, uint64_t v) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>(v | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}
template <typename T>
void Fixed(std::string* out, T v) {  // little-endian, as x86 and the wire format agree
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  out->append(b, sizeof(T));
}
void Bytes(std::string* out, int field, const std::string& bytes) {
  Varint(out, (uint64_t(field) << 3) | 2);
  Varint(out, bytes.size());
  out->append(bytes);
}

std::string EventHeader(double wall_time, int64_t step) {
  std::string e;
  Varint(&e, (1 << 3) | 1);  // wall_time: double
  Fixed(&e, wall_time);
  Varint(&e, (2 << 3) | 0);  // step: int64
  Varint(&e, static_cast<uint64_t>(step));
  return e;
}

// A JSON string literal; invalid UTF-8 is replaced rather than rejected.
std::string JsonEscape(const std::string& s) {
  return nlohmann::json(s).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

Result<std::FILE*> OpenAppend(const std::string& path) {
  size_t slash = path.rfind('/');
  if (slash != std::string::npos) RETURN_IF_ERROR(MakeDirs(path.substr(0, slash)));
  std::FILE* f = std::fopen(path.c_str(), "ab");
  if (!f) return ErrnoStatus("cannot open " + path, errno);
  return f;
}

}  // namespace

uint32_t Crc32c(const void* data, size_t size) {
  static const auto table = MakeCrcTable();
  uint32_t c = 0xFFFFFFFFu;
  auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < size; ++i) c = table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

uint32_t MaskedCrc32c(const void* data, size_t size) {
  uint32_t c = Crc32c(data, size);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

EventWriter::~EventWriter() {
  if (file_) std::fclose(file_);
}

Result<EventWriter*> EventWriter::Open(const std::string& dir) {
  std::string path = dir + "/events.out.tfevents." + std::to_string(std::time(nullptr)) + "." + HostName() + "." +
                     std::to_string(::getpid());
  ASSIGN_OR_RETURN(std::FILE * f, OpenAppend(path));
  auto* w = new EventWriter(f, path);
  std::string first = EventHeader(WallSeconds(), 0);
  Bytes(&first, 3, "brain.Event:2");  // file_version
  if (Status st = w->WriteRecord(first); !st.ok()) {
    delete w;
    return st;
  }
  return w;
}

Status EventWriter::AddScalar(const std::string& tag, double value, int64_t step, double wall_time) {
  std::string v;
  Bytes(&v, 1, tag);
  Varint(&v, (2 << 3) | 5);  // simple_value: float
  Fixed(&v, static_cast<float>(value));
  std::string summary;
  Bytes(&summary, 1, v);
  std::string e = EventHeader(wall_time, step);
  Bytes(&e, 5, summary);
  return WriteRecord(e);
}

// TFRecord framing: length, masked CRC of the length, payload, masked CRC of the payload.
Status EventWriter::WriteRecord(const std::string& payload) {
  std::string rec;
  uint64_t len = payload.size();
  Fixed(&rec, len);
  Fixed(&rec, MaskedCrc32c(rec.data(), 8));
  rec += payload;
  Fixed(&rec, MaskedCrc32c(payload.data(), payload.size()));
  if (std::fwrite(rec.data(), 1, rec.size(), file_) != rec.size() || std::fflush(file_) != 0) {
    return ErrnoStatus("cannot write " + path_, errno);
  }
  return Status::Ok();
}

JsonLines::~JsonLines() {
  if (file_) std::fclose(file_);
}

Result<JsonLines*> JsonLines::Open(const std::string& path) {
  ASSIGN_OR_RETURN(std::FILE * f, OpenAppend(path));
  return new JsonLines(f);
}

Status JsonLines::Write(const std::vector<std::pair<std::string, double>>& numbers,
                        const std::vector<std::pair<std::string, std::string>>& strings) {
  std::string line = "{";
  auto sep = [&] {
    if (line.size() > 1) line += ", ";
  };
  for (const auto& [k, v] : numbers) {
    sep();
    char buf[40] = "null";
    if (std::isfinite(v)) *std::to_chars(buf, buf + sizeof buf - 1, v).ptr = '\0';  // shortest exact
    line += JsonEscape(k) + ": " + buf;
  }
  for (const auto& [k, v] : strings) {
    sep();
    line += JsonEscape(k) + ": " + JsonEscape(v);
  }
  line += "}\n";
  if (std::fwrite(line.data(), 1, line.size(), file_) != line.size() || std::fflush(file_) != 0) {
    return ErrnoStatus("cannot write metrics", errno);
  }
  return Status::Ok();
}

std::string ProgressLine(int64_t epoch, int64_t epochs, int64_t step, int64_t steps, double loss, double samples_per_s,
                         double eta_seconds, int width) {
  int64_t filled = steps > 0 ? std::min<int64_t>(width, step * width / steps) : 0;
  std::string bar(filled, '#');
  bar.append(width - filled, '.');
  // The bar covers this epoch, and so does its ETA; the whole job's follows when more epochs come.
  auto text = [](double s) { return FormatDuration(std::chrono::milliseconds(int64_t(std::max(0.0, s) * 1000))); };
  const int64_t left_here = std::max<int64_t>(0, steps - step),
                left_after = std::max<int64_t>(0, epochs - epoch) * steps;
  const double epoch_eta =
      left_here + left_after > 0 ? eta_seconds * double(left_here) / double(left_here + left_after) : 0;
  const std::string eta = left_after > 0 ? text(epoch_eta) + " (job " + text(eta_seconds) + ")" : text(eta_seconds);
  char buf[320];
  std::snprintf(buf, sizeof buf, "epoch %lld/%lld [%s] %3lld%% %lld/%lld loss %.4f %.0f samples/s ETA %s",
                (long long)epoch, (long long)epochs, bar.c_str(), (long long)(steps > 0 ? step * 100 / steps : 0),
                (long long)step, (long long)steps, loss, samples_per_s, eta.c_str());
  return buf;
}

}  // namespace trainctl::metrics
