#include "monitor/http_server.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>

namespace trainctl::monitor {

namespace {

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string Trim(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t"), b = s.find_last_not_of(" \t");
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

// %XX and '+' of a query string.
std::string Decode(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '+') {
      out += ' ';
    } else if (s[i] == '%' && i + 2 < s.size() && std::isxdigit(static_cast<unsigned char>(s[i + 1])) &&
               std::isxdigit(static_cast<unsigned char>(s[i + 2]))) {
      out += static_cast<char>(std::stoi(s.substr(i + 1, 2), nullptr, 16));
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}

const char* Reason(int status) {
  switch (status) {
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 408:
      return "Request Timeout";
    case 413:
      return "Content Too Large";
    case 431:
      return "Request Header Fields Too Large";
    case 500:
      return "Internal Server Error";
    case 503:
      return "Service Unavailable";
    default:
      return "Status";
  }
}

void SetNonBlocking(int fd) { ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK); }

}  // namespace

std::string HttpRequest::get_param_value(const std::string& k) const {
  auto it = params.find(k);
  return it == params.end() ? "" : it->second;
}

std::string HttpRequest::get_header_value(const std::string& name) const {
  auto it = headers.find(Lower(name));
  return it == headers.end() ? "" : it->second;
}

void HttpServer::Get(const std::string& pattern, Handler handler) {
  routes_.emplace_back(std::regex(pattern), std::move(handler));
}

bool HttpServer::Listen(const std::string& host, int port) {
  addrinfo hints{}, *found = nullptr;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  const std::string service = std::to_string(port);
  if (::getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &found) != 0) return false;
  for (addrinfo* a = found; a != nullptr && listen_fd_ < 0; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, 256) == 0) {
      listen_fd_ = fd;
    } else {
      ::close(fd);
    }
  }
  ::freeaddrinfo(found);
  if (listen_fd_ < 0) return false;
  sockaddr_storage bound{};
  socklen_t len = sizeof bound;
  ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&bound), &len);
  port_ = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                            : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  SetNonBlocking(listen_fd_);
  if (::pipe2(wake_, O_CLOEXEC | O_NONBLOCK) != 0) return false;
  loop_ = std::thread([this] { Loop(); });
  for (int i = 0; i < limits_.workers; ++i) workers_.emplace_back([this] { Work(); });
  return true;
}

void HttpServer::Stop() {
  if (stopping_.exchange(true)) return;
  if (wake_[1] >= 0) {
    const char b = 's';
    ssize_t ignored = ::write(wake_[1], &b, 1);
    (void)ignored;
  }
  ready_.notify_all();
  if (loop_.joinable()) loop_.join();
  for (auto& w : workers_) {
    if (w.joinable()) w.join();
  }
  for (auto& [fd, req] : queue_) ::close(fd);
  queue_.clear();
  for (int* fd : {&listen_fd_, &wake_[0], &wake_[1]}) {
    if (*fd >= 0) ::close(*fd);
    *fd = -1;
  }
}

int HttpServer::Parse(const std::string& head, HttpRequest* req, std::string* why) const {
  size_t at = head.find("\r\n");
  const std::string line = head.substr(0, at);
  const size_t sp1 = line.find(' '), sp2 = line.rfind(' ');
  if (sp1 == std::string::npos || sp2 == sp1 || line.compare(sp2 + 1, 5, "HTTP/") != 0) {
    *why = "not an HTTP request line";
    return 400;
  }
  req->method = line.substr(0, sp1);
  const std::string target = line.substr(sp1 + 1, sp2 - sp1 - 1);
  if (req->method != "GET" && req->method != "HEAD") {
    *why = "only GET and HEAD are served";
    return 405;
  }
  const size_t q = target.find('?');
  req->path = Decode(target.substr(0, q));
  if (q != std::string::npos) {
    size_t start = q + 1;
    while (start <= target.size()) {
      size_t end = target.find('&', start);
      if (end == std::string::npos) end = target.size();
      const std::string kv = target.substr(start, end - start);
      if (!kv.empty()) {
        const size_t eq = kv.find('=');
        req->params[Decode(kv.substr(0, eq))] = eq == std::string::npos ? "" : Decode(kv.substr(eq + 1));
      }
      start = end + 1;
    }
  }
  int count = 0;
  while (at != std::string::npos && at + 2 < head.size()) {
    const size_t next = head.find("\r\n", at + 2);
    const std::string h = head.substr(at + 2, next - at - 2);
    at = next;
    if (h.empty()) break;
    if (++count > limits_.max_headers) {
      *why = "more than " + std::to_string(limits_.max_headers) + " header lines";
      return 431;
    }
    const size_t colon = h.find(':');
    if (colon == std::string::npos) {
      *why = "a header line without ':'";
      return 400;
    }
    req->headers[Lower(Trim(h.substr(0, colon)))] = Trim(h.substr(colon + 1));
  }
  // A GET has no body: one announced is refused unread (it is not kept, nor waited for).
  const std::string length = req->get_header_value("Content-Length");
  if ((!length.empty() && length != "0") || !req->get_header_value("Transfer-Encoding").empty()) {
    *why = "a request with a body; GET takes none";
    return 413;
  }
  return 0;
}

void HttpServer::Answer(int fd, const HttpResponse& res) {
  std::string out = "HTTP/1.1 " + std::to_string(res.status) + " " + Reason(res.status) + "\r\n";
  out += "Content-Type: " + res.content_type + "\r\nContent-Length: " + std::to_string(res.body.size()) +
         "\r\nConnection: close\r\n";
  for (const auto& [k, v] : res.headers) out += k + ": " + v + "\r\n";
  out += "\r\n";
  out += res.body;
  // Within the write timeout, whatever the client reads at: a client that does not read loses it.
  const auto deadline = Clock::now() + limits_.write_timeout;
  size_t done = 0;
  while (done < out.size() && !stopping_) {
    const ssize_t n = ::send(fd, out.data() + done, out.size() - done, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) break;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) break;
    pollfd p{fd, POLLOUT, 0};
    ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 200)));
  }
  ::shutdown(fd, SHUT_WR);
  ::close(fd);
}

void HttpServer::Serve(int fd, HttpRequest req) {
  HttpResponse res;
  try {
    if (!filter_ || !filter_(req, res)) {
      bool routed = false;
      for (const auto& [re, handler] : routes_) {
        std::smatch m;
        if (!std::regex_match(req.path, m, re)) continue;
        for (const auto& g : m) req.matches.push_back(g.str());
        handler(req, res);
        routed = true;
        break;
      }
      if (!routed) {
        res.status = 404;
        res.set_content("not found\n", "text/plain");
      }
    }
  } catch (const std::exception& e) {
    res = HttpResponse();
    res.status = 500;
    res.set_content(std::string("internal error: ") + e.what() + "\n", "text/plain");
  }
  if (req.method == "HEAD") res.body.clear();
  Answer(fd, res);
}

void HttpServer::Work() {
  while (true) {
    std::pair<int, HttpRequest> job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      ready_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (stopping_) return;
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    Serve(job.first, std::move(job.second));
  }
}

void HttpServer::Refuse(int fd, int status, const std::string& why) {
  HttpResponse res;
  res.status = status;
  res.set_content(why + "\n", "text/plain");
  std::string out = "HTTP/1.1 " + std::to_string(status) + " " + Reason(status) +
                    "\r\nContent-Type: text/plain\r\n"
                    "Content-Length: " +
                    std::to_string(res.body.size()) + "\r\nConnection: close\r\n\r\n" + res.body;
  ssize_t ignored = ::send(fd, out.data(), out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);  // best effort, never waits
  (void)ignored;
  // Closed only once what the client still sends is read (a second at most, 256 KiB at most):
  // closing with unread bytes would reset the connection and lose the answer on its way.
  ::shutdown(fd, SHUT_WR);
  if (lingering_.size() >= limits_.max_connections) {
    ::close(lingering_.front().fd);
    lingering_.pop_front();
  }
  lingering_.push_back({fd, Clock::now() + std::chrono::seconds(1), {}, 0});
}

void HttpServer::ReadLingering(const pollfd* revents) {
  // Refused connections: what the client still sends is read and dropped until it closes.
  char buf[4096];
  const auto now = Clock::now();
  std::deque<Pending> still;
  for (size_t i = 0; i < lingering_.size(); ++i) {
    Pending& l = lingering_[i];
    bool close = now >= l.deadline;
    if (!close && revents[i].revents) {
      const ssize_t n = ::recv(l.fd, buf, sizeof buf, MSG_DONTWAIT);
      close = n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR);
      if (n > 0) l.dropped += static_cast<size_t>(n);
      close = close || l.dropped >= (1 << 18);
    }
    if (close) {
      ::close(l.fd);
    } else {
      still.push_back(std::move(l));
    }
  }
  lingering_.swap(still);
}

void HttpServer::ReadHeads(const pollfd* revents) {
  // Heads that grew: complete ones go to the workers, bad ones are refused.
  char buf[4096];
  std::vector<bool> done(pending_.size(), false);
  for (size_t i = 0; i < pending_.size(); ++i) {
    if (revents[i].revents == 0) continue;
    Pending& p = pending_[i];
    const ssize_t n = ::recv(p.fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
      ::close(p.fd);
      done[i] = true;
      continue;
    }
    if (n < 0) continue;
    p.head.append(buf, static_cast<size_t>(n));
    const size_t end = p.head.find("\r\n\r\n");
    if (end == std::string::npos) {
      if (p.head.size() > limits_.max_head) {
        Refuse(p.fd, 431, "request head larger than " + std::to_string(limits_.max_head) + " bytes");
        done[i] = true;
      }
      continue;
    }
    HttpRequest req;
    std::string why;
    if (int status = Parse(p.head.substr(0, end + 2), &req, &why); status != 0) {
      Refuse(p.fd, status, why);
    } else {
      std::lock_guard<std::mutex> lock(mu_);
      if (queue_.size() >= 256) {
        Refuse(p.fd, 503, "busy");
      } else {
        queue_.emplace_back(p.fd, std::move(req));
        ready_.notify_one();
      }
    }
    done[i] = true;
  }
  // Heads not whole by their deadline: closed.
  const auto now = Clock::now();
  for (size_t i = 0; i < pending_.size(); ++i) {
    if (!done[i] && now >= pending_[i].deadline) {
      Refuse(pending_[i].fd, 408, "the request head did not arrive in time");
      done[i] = true;
    }
  }
  std::deque<Pending> kept;
  for (size_t i = 0; i < pending_.size(); ++i) {
    if (!done[i]) kept.push_back(std::move(pending_[i]));
  }
  pending_.swap(kept);
}

void HttpServer::AcceptAll() {
  while (true) {
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0 && (errno == EMFILE || errno == ENFILE)) {
      if (pending_.empty()) {
        resting_until_ = Clock::now() + std::chrono::milliseconds(100);
        break;
      }
      ::close(pending_.front().fd);  // the oldest unfinished one makes way
      pending_.pop_front();
      continue;
    }
    if (fd < 0) break;
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (pending_.size() >= limits_.max_connections) {  // the oldest unfinished one makes way
      ::close(pending_.front().fd);
      pending_.pop_front();
    }
    pending_.push_back({fd, Clock::now() + limits_.head_deadline, {}, 0});
  }
}

void HttpServer::Loop() {
  std::vector<pollfd> fds;
  while (!stopping_) {
    fds.clear();
    // Out of descriptors with nothing to close: the listener rests a moment rather than spin.
    fds.push_back({listen_fd_, static_cast<short>(Clock::now() < resting_until_ ? 0 : POLLIN), 0});
    fds.push_back({wake_[0], POLLIN, 0});
    for (const auto& p : pending_) fds.push_back({p.fd, POLLIN, 0});
    for (const auto& p : lingering_) fds.push_back({p.fd, POLLIN, 0});
    int timeout_ms = lingering_.empty() ? 1000 : 100;
    if (!pending_.empty()) {
      auto soonest = std::min_element(pending_.begin(), pending_.end(),
                                      [](const Pending& a, const Pending& b) { return a.deadline < b.deadline; });
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(soonest->deadline - Clock::now()).count();
      timeout_ms = static_cast<int>(std::clamp<int64_t>(left, 0, 1000));
    }
    const int rc = ::poll(fds.data(), fds.size(), timeout_ms);
    if (rc < 0 && errno != EINTR) break;
    if (stopping_) break;
    ReadLingering(fds.data() + 2 + pending_.size());  // before ReadHeads refuses more
    ReadHeads(fds.data() + 2);
    if (fds[1].revents) {
      char drain[64];
      while (::read(wake_[0], drain, sizeof drain) > 0) {
      }
    }
    if (fds[0].revents) AcceptAll();
  }
  for (const auto& p : pending_) ::close(p.fd);
  for (const auto& p : lingering_) ::close(p.fd);
}
}  // namespace trainctl::monitor
