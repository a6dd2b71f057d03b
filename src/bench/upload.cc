#include "bench/upload.h"

#include <curl/curl.h>

#include <cstdio>
#include <filesystem>

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

// Each segment of a key percent-encoded, the slashes kept.
std::string EncodeKey(CURL* curl, const std::string& key) {
  std::string out;
  size_t start = 0;
  while (true) {
    const size_t slash = key.find('/', start);
    const std::string seg = key.substr(start, slash == std::string::npos ? std::string::npos : slash - start);
    char* enc = curl_easy_escape(curl, seg.c_str(), static_cast<int>(seg.size()));
    out += enc ? enc : "";
    curl_free(enc);
    if (slash == std::string::npos) break;
    out += "/";
    start = slash + 1;
  }
  return out;
}

}  // namespace

Status CheckUpload(const UploadTarget& t) {
  if (auto b = ParseUrl(t.url); !b.ok()) return b.status();
  if (Env("AWS_ACCESS_KEY_ID").empty() || Env("AWS_SECRET_ACCESS_KEY").empty()) {
    return InvalidArgument("upload: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN for "
                           "temporary credentials) for " + t.url + "; the matrix holds no secrets");
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
  static const bool init = curl_global_init(CURL_GLOBAL_DEFAULT) == CURLE_OK;
  if (!init) return Internal("libcurl did not initialize");
  CURL* curl = curl_easy_init();
  if (!curl) return Internal("libcurl: no handle");
  const std::string sigv4 = "aws:amz:" + t.region + ":s3";
  const std::string user = Env("AWS_ACCESS_KEY_ID") + ":" + Env("AWS_SECRET_ACCESS_KEY");
  struct curl_slist* headers = curl_slist_append(nullptr, "x-amz-content-sha256: UNSIGNED-PAYLOAD");
  if (const std::string token = Env("AWS_SESSION_TOKEN"); !token.empty()) {
    headers = curl_slist_append(headers, ("x-amz-security-token: " + token).c_str());
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
  for (const auto& path : files) {
    if (!result.ok()) break;
    const std::string rel = std::filesystem::relative(path, dir, ec).string();
    const std::string key = (b.prefix.empty() ? "" : b.prefix + "/") + name + "/" + rel;
    const std::string url = endpoint + "/" + EncodeKey(curl, b.bucket) + "/" + EncodeKey(curl, key);
    FILE* in = std::fopen(path.c_str(), "rb");
    if (!in) {
      result = Internal("cannot read " + path.string());
      break;
    }
    curl_easy_reset(curl);
    char error[CURL_ERROR_SIZE] = {};
    curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
    curl_easy_setopt(curl, CURLOPT_UPLOAD, 1L);
    curl_easy_setopt(curl, CURLOPT_READDATA, in);
    curl_easy_setopt(curl, CURLOPT_INFILESIZE_LARGE, static_cast<curl_off_t>(std::filesystem::file_size(path, ec)));
    curl_easy_setopt(curl, CURLOPT_AWS_SIGV4, sigv4.c_str());
    curl_easy_setopt(curl, CURLOPT_USERPWD, user.c_str());
    curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT, 30L);
    curl_easy_setopt(curl, CURLOPT_TIMEOUT, 600L);
    curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, error);
    curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, +[](char*, size_t size, size_t n, void*) { return size * n; });
    const CURLcode rc = curl_easy_perform(curl);
    std::fclose(in);
    long http = 0;
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &http);
    if (rc != CURLE_OK) {
      result = Unavailable("PUT " + url + ": " + (error[0] ? error : curl_easy_strerror(rc)));
    } else if (http < 200 || http >= 300) {
      result = Unavailable("PUT " + url + ": HTTP " + std::to_string(http));
    } else {
      ++count;
    }
  }
  curl_slist_free_all(headers);
  curl_easy_cleanup(curl);
  RETURN_IF_ERROR(result);
  return count;
}

}  // namespace trainctl::bench
