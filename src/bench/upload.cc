#include "bench/upload.h"

#include <curl/curl.h>  // types and constants only: libcurl itself is loaded when an upload runs
#include <dlfcn.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <type_traits>

#include "common/subprocess.h"

namespace trainctl::bench {
namespace {

struct Bucket {
  std::string bucket, prefix;
};

Result<Bucket> ParseUrl(const std::string& url) {
  if (url.rfind("s3://", 0) != 0 || url.size() <= 5 || url[5] == '/') {
    return InvalidArgument("upload.url: expected s3://BUCKET[/PREFIX], got \"" + url + "\"");
  }
  const std::string rest = url.substr(5);
  const size_t slash = rest.find('/');
  Bucket b{rest.substr(0, slash), slash == std::string::npos ? "" : rest.substr(slash + 1)};
  while (!b.prefix.empty() && b.prefix.back() == '/') b.prefix.pop_back();
  return b;
}

std::string Env(const char* key) { return GetEnv(CurrentEnvironment(), key).value_or(""); }

// libcurl, opened on first use: linking it would load its ~25 libraries (TLS, Kerberos, LDAP...)
// into every trainctl process (each agent and worker: about 7 ms of each one's start), for the
// one verb that uploads.
// (clang-format 14 rewraps this list differently on each pass.)
// clang-format off
#define TRAINCTL_CURL_FUNCTIONS(X)                                                                    \
  X(global_init) X(easy_init) X(easy_reset) X(easy_setopt) X(easy_perform) X(easy_getinfo)            \
  X(easy_strerror) X(easy_escape) X(free) X(slist_append) X(slist_free_all) X(easy_cleanup)
// clang-format on
struct Curl {
#define TRAINCTL_CURL_FIELD(name) decltype(&curl_##name) name;
  TRAINCTL_CURL_FUNCTIONS(TRAINCTL_CURL_FIELD)
#undef TRAINCTL_CURL_FIELD
};

Result<const Curl*> LoadCurl() {
  static Curl curl;
  static const std::string error = [] {
    void* lib = ::dlopen("libcurl.so.4", RTLD_NOW | RTLD_LOCAL);
    if (!lib) return std::string("cannot load libcurl.so.4 (install Debian's libcurl4): ") + ::dlerror();
    bool all = true;
    auto load = [&](auto* fn, const char* name) {
      *fn = reinterpret_cast<std::remove_pointer_t<decltype(fn)>>(::dlsym(lib, name));
      all = all && *fn;
    };
#define TRAINCTL_CURL_LOAD(name) load(&curl.name, "curl_" #name);
    TRAINCTL_CURL_FUNCTIONS(TRAINCTL_CURL_LOAD)
#undef TRAINCTL_CURL_LOAD
    if (!all) return std::string("libcurl.so.4 lacks a function trainctl uses (too old?)");
    if (curl.global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) return std::string("libcurl did not initialize");
    return std::string();
  }();
  if (!error.empty()) return Unavailable(error);
  return &curl;
}

// Each segment of a key percent-encoded, the slashes kept.
std::string EncodeKey(const Curl& lib, CURL* curl, const std::string& key) {
  std::string out;
  size_t start = 0;
  while (true) {
    const size_t slash = key.find('/', start);
    const std::string seg = key.substr(start, slash == std::string::npos ? std::string::npos : slash - start);
    char* enc = lib.easy_escape(curl, seg.c_str(), static_cast<int>(seg.size()));
    out += enc ? enc : "";
    lib.free(enc);
    if (slash == std::string::npos) break;
    out += "/";
    start = slash + 1;
  }
  return out;
}

// " SignatureDoesNotMatch" from an S3 error document's <Code>, with what it means where that is
// not plain; "" when the reply has none.
std::string S3ErrorCode(const std::string& reply) {
  const size_t open = reply.find("<Code>");
  const size_t close = open == std::string::npos ? open : reply.find("</Code>", open);
  if (close == std::string::npos) return "";
  const std::string code = reply.substr(open + 6, close - open - 6);
  if (code.empty() || code.size() > 64 ||
      code.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz") != std::string::npos) {
    return "";
  }
  static const std::pair<const char*, const char*> hints[] = {
      {"SignatureDoesNotMatch", "AWS_SECRET_ACCESS_KEY is not the secret of AWS_ACCESS_KEY_ID"},
      {"InvalidAccessKeyId", "the store knows no such AWS_ACCESS_KEY_ID"},
      {"NoSuchBucket", "the bucket of upload.url does not exist"},
      {"AccessDenied", "the key may not write there"}};
  for (const auto& [name, hint] : hints) {
    if (code == name) return " " + code + " (" + hint + ")";
  }
  return " " + code;
}

}  // namespace

Status CheckUpload(const UploadTarget& t) {
  if (auto b = ParseUrl(t.url); !b.ok()) return b.status();
  if (Env("AWS_ACCESS_KEY_ID").empty() || Env("AWS_SECRET_ACCESS_KEY").empty()) {
    return InvalidArgument(
        "upload: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN for "
        "temporary credentials) for " +
        t.url + "; the matrix holds no secrets");
  }
  if (!t.endpoint.empty() && t.endpoint.rfind("http://", 0) != 0 && t.endpoint.rfind("https://", 0) != 0) {
    return InvalidArgument("upload.endpoint: expected an http:// or https:// URL, got \"" + t.endpoint + "\"");
  }
  return Status::Ok();
}

Result<int> UploadTree(const UploadTarget& t, const std::string& dir, const std::string& name) {
  RETURN_IF_ERROR(CheckUpload(t));
  ASSIGN_OR_RETURN(Bucket b, ParseUrl(t.url));
  std::string endpoint = t.endpoint.empty() ? "https://s3." + t.region + ".amazonaws.com" : t.endpoint;
  while (!endpoint.empty() && endpoint.back() == '/') endpoint.pop_back();
  ASSIGN_OR_RETURN(const Curl* loaded, LoadCurl());
  const Curl& lib = *loaded;
  CURL* curl = lib.easy_init();
  if (!curl) return Internal("libcurl: no handle");
  const std::string sigv4 = "aws:amz:" + t.region + ":s3";
  const std::string user = Env("AWS_ACCESS_KEY_ID") + ":" + Env("AWS_SECRET_ACCESS_KEY");
  struct curl_slist* headers = lib.slist_append(nullptr, "x-amz-content-sha256: UNSIGNED-PAYLOAD");
  if (const std::string token = Env("AWS_SESSION_TOKEN"); !token.empty()) {
    headers = lib.slist_append(headers, ("x-amz-security-token: " + token).c_str());
  }
  int count = 0;
  Status result = Status::Ok();
  std::error_code ec;
  std::vector<std::filesystem::path> files;
  for (auto it = std::filesystem::recursive_directory_iterator(dir, ec); !ec && it != std::filesystem::end(it);
       it.increment(ec)) {
    if (it->is_regular_file(ec)) files.push_back(it->path());
  }
  if (ec) result = Internal("cannot list " + dir + ": " + ec.message());
  // results.json last: a set in the bucket without it is one whose upload did not finish, and a
  // rerun puts every file again.
  std::sort(files.begin(), files.end(), [&](const std::filesystem::path& a, const std::filesystem::path& b) {
    const bool a_last = a == std::filesystem::path(dir) / "results.json";
    const bool b_last = b == std::filesystem::path(dir) / "results.json";
    return a_last != b_last ? b_last : a < b;
  });
  std::string reply;
  for (const auto& path : files) {
    if (!result.ok()) break;
    const std::string rel = std::filesystem::relative(path, dir, ec).string();
    const std::string key = (b.prefix.empty() ? "" : b.prefix + "/") + name + "/" + rel;
    const std::string url = endpoint + "/" + EncodeKey(lib, curl, b.bucket) + "/" + EncodeKey(lib, curl, key);
    FILE* in = std::fopen(path.c_str(), "rb");
    if (!in) {
      result = Internal("cannot read " + path.string());
      break;
    }
    lib.easy_reset(curl);
    char error[CURL_ERROR_SIZE] = {};
    lib.easy_setopt(curl, CURLOPT_URL, url.c_str());
    lib.easy_setopt(curl, CURLOPT_UPLOAD, 1L);
    lib.easy_setopt(curl, CURLOPT_READDATA, in);
    lib.easy_setopt(curl, CURLOPT_INFILESIZE_LARGE, static_cast<curl_off_t>(std::filesystem::file_size(path, ec)));
    lib.easy_setopt(curl, CURLOPT_AWS_SIGV4, sigv4.c_str());
    lib.easy_setopt(curl, CURLOPT_USERPWD, user.c_str());
    lib.easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
    lib.easy_setopt(curl, CURLOPT_CONNECTTIMEOUT, 30L);
    lib.easy_setopt(curl, CURLOPT_TIMEOUT, 600L);
    lib.easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
    lib.easy_setopt(curl, CURLOPT_ERRORBUFFER, error);
    reply.clear();
    lib.easy_setopt(curl, CURLOPT_WRITEDATA, &reply);
    lib.easy_setopt(
        curl, CURLOPT_WRITEFUNCTION, +[](char* data, size_t size, size_t n, void* out) {
          auto* text = static_cast<std::string*>(out);
          text->append(data, std::min(size * n, text->size() < 65536 ? 65536 - text->size() : 0));
          return size * n;
        });
    const CURLcode rc = lib.easy_perform(curl);
    std::fclose(in);
    long http = 0;
    lib.easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &http);
    if (rc != CURLE_OK) {
      result = Unavailable("PUT " + url + ": " + (error[0] ? error : lib.easy_strerror(rc)));
    } else if (http < 200 || http >= 300) {
      result = Unavailable("PUT " + url + ": HTTP " + std::to_string(http) + S3ErrorCode(reply));
    } else {
      ++count;
    }
  }
  lib.slist_free_all(headers);
  lib.easy_cleanup(curl);
  RETURN_IF_ERROR(result);
  return count;
}

}  // namespace trainctl::bench
