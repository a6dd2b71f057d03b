#include "store/tcp/wire.h"

#include <cstring>

namespace trainctl::wire {

Writer& Writer::U8(uint8_t v) {
  body_.push_back(static_cast<char>(v));
  return *this;
}

Writer& Writer::I64(int64_t v) {
  uint64_t u = static_cast<uint64_t>(v);
  for (int i = 0; i < 8; ++i) body_.push_back(static_cast<char>((u >> (8 * i)) & 0xff));
  return *this;
}

Writer& Writer::Str(std::string_view s) {
  uint32_t n = static_cast<uint32_t>(s.size());
  for (int i = 0; i < 4; ++i) body_.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  body_.append(s);
  return *this;
}

std::string Writer::Frame() const {
  std::string out;
  uint32_t n = static_cast<uint32_t>(body_.size());
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  return out + body_;
}

static uint64_t LoadLe(const char* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= static_cast<uint64_t>(static_cast<uint8_t>(p[i])) << (8 * i);
  return v;
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
  uint64_t n = LoadLe(rest_.data(), 4);
  if (rest_.size() - 4 < n) return false;
  s->assign(rest_.data() + 4, n);
  rest_.remove_prefix(4 + n);
  return true;
}

uint32_t FrameLength(std::string_view buf) { return static_cast<uint32_t>(LoadLe(buf.data(), 4)); }

int TakeFrame(std::string* buf, std::string* body, uint32_t max) {
  if (buf->size() < 4) return 0;
  const uint64_t n = FrameLength(*buf);
  if (n > max) return -1;
  if (buf->size() - 4 < n) return 0;
  body->assign(buf->data() + 4, n);
  buf->erase(0, 4 + n);
  return 1;
}

}  // namespace trainctl::wire
