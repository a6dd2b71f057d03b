#include "common/wire.h"

#include <cstring>

namespace trainctl::wire {
namespace {

void PutLe(std::string* out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

uint64_t LoadLe(const char* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= static_cast<uint64_t>(static_cast<uint8_t>(p[i])) << (8 * i);
  return v;
}

}  // namespace

Writer& Writer::U8(uint8_t v) {
  body_.push_back(static_cast<char>(v));
  return *this;
}

Writer& Writer::I64(int64_t v) {
  PutLe(&body_, static_cast<uint64_t>(v), 8);
  return *this;
}

Writer& Writer::Str(std::string_view s) {
  PutLe(&body_, static_cast<uint32_t>(s.size()), 4);
  body_.append(s);
  return *this;
}

Writer& Writer::Raw(const void* p, size_t n) {
  body_.append(static_cast<const char*>(p), n);
  return *this;
}

std::string Writer::Frame() const {
  const uint8_t kind = body_.empty() ? 0 : static_cast<uint8_t>(body_[0]);
  const size_t rest = body_.empty() ? 0 : body_.size() - 1;
  std::string out = FrameHeader(kind, rest);
  if (rest) out.append(body_, 1, rest);
  return out;
}

bool Reader::U8(uint8_t* v) {
  if (rest_.empty()) return false;
  *v = static_cast<uint8_t>(rest_[0]);
  rest_.remove_prefix(1);
  return true;
}

bool Reader::I64(int64_t* v) {
  if (rest_.size() < 8) return false;
  *v = static_cast<int64_t>(LoadLe(rest_.data(), 8));
  rest_.remove_prefix(8);
  return true;
}

bool Reader::Str(std::string* s) {
  if (rest_.size() < 4) return false;
  const uint64_t n = LoadLe(rest_.data(), 4);
  if (rest_.size() - 4 < n) return false;
  s->assign(rest_.data() + 4, n);
  rest_.remove_prefix(4 + n);
  return true;
}

bool Reader::Floats(float* out, int64_t n) {
  const float* v = FloatView(n);
  if (!v) return false;
  std::memcpy(out, v, n * sizeof(float));
  return true;
}

const float* Reader::FloatView(int64_t n) {
  if (n < 0 || static_cast<uint64_t>(n) > rest_.size() / sizeof(float)) return nullptr;
  const float* v = reinterpret_cast<const float*>(rest_.data());
  rest_.remove_prefix(n * sizeof(float));
  return v;
}

std::string FrameHeader(uint8_t kind, uint64_t rest) {
  std::string head(1, static_cast<char>(kind));
  PutLe(&head, rest, 8);
  return head;
}

uint8_t FrameKind(std::string_view buf) { return static_cast<uint8_t>(buf[0]); }
uint64_t FrameRest(std::string_view buf) { return LoadLe(buf.data() + 1, 8); }

int TakeFrame(std::string* buf, std::string* body, uint64_t max) {
  if (buf->size() < kFrameHeaderBytes) return 0;
  const uint64_t rest = FrameRest(*buf);
  if (rest > max - kFrameHeaderBytes || max < kFrameHeaderBytes) return -1;
  if (buf->size() - kFrameHeaderBytes < rest) return 0;
  body->assign(1, (*buf)[0]);
  body->append(*buf, kFrameHeaderBytes, rest);
  buf->erase(0, kFrameHeaderBytes + rest);
  return 1;
}

}  // namespace trainctl::wire
