#include "checkpoint/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <new>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "common/fs.h"

namespace trainctl::checkpoint {
namespace {

using nlohmann::json;

constexpr uint64_t kMaxHeaderBytes = 100 << 20;
constexpr const char* kCrcKey = "trainctl.crc32";
constexpr const char* kStepKey = "trainctl.step";
constexpr const char* kPrefix = "ckpt-";
constexpr const char* kSuffix = ".safetensors";

uint32_t Crc32(const std::string& data, size_t offset) {
  uLong crc = ::crc32(0L, Z_NULL, 0);
  const auto* p = reinterpret_cast<const Bytef*>(data.data() + offset);
  size_t left = data.size() - offset;
  while (left > 0) {
    uInt chunk = static_cast<uInt>(std::min<size_t>(left, 1u << 30));
    crc = ::crc32(crc, p, chunk);
    p += chunk;
    left -= chunk;
  }
  return static_cast<uint32_t>(crc);
}

int64_t Elements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0 || (d > 0 && n > INT64_MAX / d)) return -1;
    n *= d;
  }
  return n;
}

// A header's list of whole numbers from 0 to `max` (a shape, byte offsets), or nullopt. Not
// json::get, which converts a float such as 5e23 to an integer with undefined behaviour.
std::optional<std::vector<uint64_t>> Naturals(const json& j, uint64_t max) {
  if (!j.is_array()) return std::nullopt;
  std::vector<uint64_t> out;
  for (const auto& v : j) {
    if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<int64_t>() >= 0)) return std::nullopt;
    const uint64_t n = v.is_number_unsigned() ? v.get<uint64_t>() : static_cast<uint64_t>(v.get<int64_t>());
    if (n > max) return std::nullopt;
    out.push_back(n);
  }
  return out;
}

// The step from "ckpt-<step>.safetensors", or -1.
int64_t StepOf(const std::string& filename) {
  std::string prefix = kPrefix, suffix = kSuffix;
  if (filename.size() <= prefix.size() + suffix.size() || filename.rfind(prefix, 0) != 0 ||
      filename.compare(filename.size() - suffix.size(), suffix.size(), suffix) != 0) {
    return -1;
  }
  std::string digits = filename.substr(prefix.size(), filename.size() - prefix.size() - suffix.size());
  if (digits.empty() || digits.size() > 18 ||
      !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return -1;
  }
  return std::stoll(digits);
}

}  // namespace

std::string Checkpoint::Meta(const std::string& key) const {
  auto it = metadata.find(key);
  return it == metadata.end() ? std::string() : it->second;
}

const Blob* Checkpoint::Find(const std::string& name) const {
  for (const auto& t : tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

int DtypeSize(const std::string& dtype) {
  static const std::map<std::string, int> sizes = {{"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8},
                                                   {"I32", 4}, {"I16", 2}, {"I8", 1},  {"U8", 1},   {"BOOL", 1},
                                                   {"U16", 2}, {"U32", 4}, {"U64", 8}};
  auto it = sizes.find(dtype);
  return it == sizes.end() ? 0 : it->second;
}

Result<std::string> Encode(const Checkpoint& c) {
  json header = json::object();
  std::string data;
  std::set<std::string> names;
  for (const auto& t : c.tensors) {
    int size = DtypeSize(t.dtype);
    int64_t elements = Elements(t.shape);
    if (size == 0) return InvalidArgument("tensor " + t.name + ": unknown dtype " + t.dtype);
    if (elements < 0 || static_cast<uint64_t>(elements) * size != t.data.size()) {
      return InvalidArgument("tensor " + t.name + ": " + std::to_string(t.data.size()) +
                             " bytes do not match its dtype and shape");
    }
    if (t.name.empty() || t.name == "__metadata__" || !names.insert(t.name).second) {
      return InvalidArgument("tensor name " + t.name + " is empty, reserved or repeated");
    }
    header[t.name] = {
        {"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {data.size(), data.size() + t.data.size()}}};
    data += t.data;
  }
  json meta = json::object();
  for (const auto& [k, v] : c.metadata) meta[k] = v;
  meta[kStepKey] = std::to_string(c.step);
  meta[kCrcKey] = std::to_string(Crc32(data, 0));
  header["__metadata__"] = meta;
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data section starts 8-byte aligned
  std::string out(8, '\0');
  uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + text + data;
}

namespace {
// How deep a header's JSON nests, counted without parsing it (strings skipped): a safetensors
// header is 3 deep; 30 MB of "[[[[..." would cost a parser gigabytes.
int JsonDepth(std::string_view text) {
  int depth = 0, most = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\')
        ++i;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      most = std::max(most, ++depth);
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return most;
}
constexpr int kMaxHeaderDepth = 8;
}  // namespace

namespace {

// A checkpoint as its header describes it: the tensors' names, dtypes and shapes (their data not
// yet read), where each one's bytes lie in the data section (`ranges`, parallel to the tensors),
// and the metadata; every range checked against `data_size`, and the whole section claimed.
struct Layout {
  Checkpoint c;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
};

// `whole_file`: the header heads a file of `data_size` more bytes, which the tensors' data must be
// exactly (a file cut short, or grown, is named so before any range is looked at).
Result<Layout> ParseHeader(std::string_view text, uint64_t data_size, const std::string& source, bool whole_file) {
  auto bad = [&source](const std::string& why) { return InvalidArgument(source + ": " + why); };
  if (JsonDepth(text) > kMaxHeaderDepth) return bad("corrupt header: nested too deep");
  json header;
  try {
    header = json::parse(text);
  } catch (const json::exception& e) {
    return bad(std::string("corrupt header: ") + e.what());
  }
  if (!header.is_object()) return bad("corrupt header: not a JSON object");
  if (whole_file) {
    uint64_t declared = 0;
    for (const auto& [name, entry] : header.items()) {
      if (name == "__metadata__") continue;
      const auto offsets = entry.is_object() && entry.contains("data_offsets")
                               ? Naturals(entry["data_offsets"], UINT64_MAX)
                               : std::nullopt;
      if (!offsets || offsets->size() != 2)
        return bad("tensor " + name + ": its data_offsets are not two whole numbers");
      declared = std::max(declared, (*offsets)[1]);
    }
    if (declared != data_size) {
      return bad("truncated or corrupt: the header declares " + std::to_string(declared) +
                 " bytes of tensor data, the file holds " + std::to_string(data_size));
    }
  }
  Layout l;
  uint64_t covered = 0;
  try {
    for (const auto& [name, entry] : header.items()) {
      if (name == "__metadata__") continue;
      Blob t;
      t.name = name;
      t.dtype = entry.at("dtype").get<std::string>();
      const auto shape = Naturals(entry.at("shape"), INT64_MAX);
      if (!shape) return bad("tensor " + name + ": its shape is not a list of whole numbers from 0");
      t.shape.assign(shape->begin(), shape->end());
      const auto offsets_read = Naturals(entry.at("data_offsets"), UINT64_MAX);
      if (!offsets_read) return bad("tensor " + name + ": its data_offsets are not whole numbers from 0");
      const std::vector<uint64_t>& offsets = *offsets_read;
      int size = DtypeSize(t.dtype);
      int64_t elements = Elements(t.shape);
      if (size == 0) return bad("tensor " + name + ": unknown dtype " + t.dtype);
      if (offsets.size() != 2 || offsets[0] > offsets[1] || offsets[1] > data_size || elements < 0 ||
          static_cast<uint64_t>(elements) > data_size / size ||
          offsets[1] - offsets[0] != static_cast<uint64_t>(elements) * size) {
        return bad("tensor " + name + ": byte range does not fit the file (truncated?)");
      }
      covered += offsets[1] - offsets[0];
      l.c.tensors.push_back(std::move(t));
      l.ranges.emplace_back(offsets[0], offsets[1]);
    }
    if (covered != data_size) return bad("the data section has bytes no tensor claims");
    if (header.contains("__metadata__")) {
      for (const auto& [k, v] : header["__metadata__"].items()) l.c.metadata[k] = v.get<std::string>();
    }
  } catch (const json::exception& e) {
    return bad(std::string("corrupt header: ") + e.what());
  }
  if (!l.c.metadata.count(kCrcKey)) return bad("no trainctl.crc32 in the metadata");
  return l;
}

// The checksum the metadata records against `crc` of the data section, and the step: what is
// left to check once the data has been read.
Result<Checkpoint> Finish(Checkpoint c, uint32_t crc, const std::string& source) {
  auto bad = [&source](const std::string& why) { return InvalidArgument(source + ": " + why); };
  if (c.metadata[kCrcKey] != std::to_string(crc)) return bad("checksum mismatch: the tensor data is corrupt");
  auto step = c.metadata.find(kStepKey);
  if (step != c.metadata.end()) {
    const std::string& text = step->second;
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), c.step);
    if (text.empty() || ec != std::errc() || end != text.data() + text.size() || c.step < 0 ||
        c.step > (int64_t{1} << 53)) {
      return bad("metadata field 'trainctl.step' is '" + text.substr(0, 64) + "', expected a step count");
    }
  }
  c.metadata.erase(kCrcKey);
  c.metadata.erase(kStepKey);
  return c;
}

uint64_t HeaderLength(std::string_view head) {
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(static_cast<uint8_t>(head[i])) << (8 * i);
  return n;
}

}  // namespace

Result<Checkpoint> Decode(const std::string& bytes, const std::string& source) {
  auto bad = [&source](const std::string& why) { return InvalidArgument(source + ": " + why); };
  if (bytes.size() < 8) return bad("truncated: shorter than a safetensors header");
  const uint64_t n = HeaderLength(bytes);
  if (n > kMaxHeaderBytes || n > bytes.size() - 8)
    return bad("truncated or corrupt: header length " + std::to_string(n));
  const size_t data_start = 8 + n;
  ASSIGN_OR_RETURN(Layout l,
                   ParseHeader(std::string_view(bytes).substr(8, n), bytes.size() - data_start, source, false));
  for (size_t i = 0; i < l.ranges.size(); ++i) {
    l.c.tensors[i].data = bytes.substr(data_start + l.ranges[i].first, l.ranges[i].second - l.ranges[i].first);
  }
  return Finish(std::move(l.c), Crc32(bytes, data_start), source);
}

Result<Checkpoint> ReadCheckpointFile(const std::string& path) {
  auto bad = [&path](const std::string& why) { return InvalidArgument(path + ": " + why); };
  struct stat st {};
  auto opened = OpenRegularFile(path, &st);
  if (!opened.ok()) {
    if (opened.status().code() == Code::kInvalidArgument) {
      return bad("not a regular file; expected a .safetensors model or checkpoint");
    }
    const std::string& why = opened.status().message();  // "cannot open PATH: strerror"
    return NotFound(path + why.substr(std::min(why.size(), ("cannot open " + path).size())));
  }
  struct FdCloser {
    int fd;
    ~FdCloser() { ::close(fd); }
  } closer{*opened};
  const int fd = *opened;
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  auto read_at = [&](char* out, uint64_t offset, uint64_t n) {
    for (uint64_t done = 0; done < n;) {
      const ssize_t got = ::pread(fd, out + done, n - done, static_cast<off_t>(offset + done));
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) return false;
      done += static_cast<uint64_t>(got);
    }
    return true;
  };
  char head[8];
  if (size < 8 || !read_at(head, 0, 8)) return bad("truncated: shorter than a safetensors header");
  const uint64_t n = HeaderLength(std::string_view(head, 8));
  if (n > kMaxHeaderBytes || n > size - 8) return bad("truncated or corrupt: header length " + std::to_string(n));
  std::string header_text(n, '\0');
  if (!read_at(header_text.data(), 8, n)) return bad("truncated: the header is cut short");
  // The data the tensors declare must be the rest of the file: checked before it is read, and it
  // is read once, in file order, through the checksum straight into each tensor.
  ASSIGN_OR_RETURN(Layout l, ParseHeader(header_text, size - 8 - n, path, true));
  std::vector<size_t> order(l.ranges.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return l.ranges[a].first < l.ranges[b].first; });
  uLong crc = ::crc32(0L, Z_NULL, 0);
  uint64_t at = 0;  // how much of the data section went through the checksum
  constexpr uint64_t kChunk = 8 << 20;
  try {
    for (size_t i : order) {
      const auto [begin, end] = l.ranges[i];
      if (begin != at)
        return bad("tensor " + l.c.tensors[i].name + ": its bytes overlap another tensor's or leave a gap");
      std::string& data = l.c.tensors[i].data;
      data.resize(end - begin);
      for (uint64_t done = 0; done < data.size();) {
        const uint64_t part = std::min<uint64_t>(kChunk, data.size() - done);
        if (!read_at(data.data() + done, 8 + n + begin + done, part)) {
          return bad("truncated: the file shrank while it was read");
        }
        crc = ::crc32(crc, reinterpret_cast<const Bytef*>(data.data() + done), static_cast<uInt>(part));
        done += part;
      }
      at = end;
    }
  } catch (const std::bad_alloc&) {
    return Internal(path + ": not enough memory to read its " + std::to_string(size) + " bytes");
  }
  return Finish(std::move(l.c), static_cast<uint32_t>(crc), path);
}

std::string CheckpointDir::PathFor(int64_t step) const {
  char name[64];
  std::snprintf(name, sizeof name, "%s%010lld%s", kPrefix, static_cast<long long>(step), kSuffix);
  return dir_ + "/" + name;
}

std::vector<std::string> CheckpointDir::List() const {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir_, ec)) {
    int64_t step = StepOf(entry.path().filename().string());
    if (step >= 0 && entry.is_regular_file(ec)) found.emplace_back(step, entry.path().string());
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> paths;
  for (auto& [step, path] : found) paths.push_back(std::move(path));
  return paths;
}

Status CheckpointDir::Save(const Checkpoint& c) {
  RETURN_IF_ERROR(MakeDirs(dir_));
  ASSIGN_OR_RETURN(std::string bytes, Encode(c));
  RETURN_IF_ERROR(AtomicWriteFile(PathFor(c.step), bytes, file_mode_));
  std::vector<std::string> all = List();
  for (size_t i = 0; keep_last_ > 0 && i + keep_last_ < all.size(); ++i) {
    std::error_code ec;
    std::filesystem::remove(all[i], ec);
  }
  return Status::Ok();
}

Result<Checkpoint> CheckpointDir::LoadLatest(std::vector<std::string>* skipped) const {
  std::vector<std::string> all = List();
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    Result<Checkpoint> c = ReadCheckpointFile(*it);
    if (c.ok()) return c;
    if (skipped) skipped->push_back(c.status().message());
  }
  return NotFound("no valid checkpoint in " + dir_);
}

}  // namespace trainctl::checkpoint
