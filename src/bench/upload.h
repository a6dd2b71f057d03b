// The bench's optional last step: its result set copied to S3-compatible storage, each file PUT
// with AWS Signature Version 4 (libcurl signs it) under s3://BUCKET/PREFIX/. Credentials come from
// the environment as the AWS tools read them (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
// AWS_SESSION_TOKEN), never from the matrix. Path-style URLs (ENDPOINT/BUCKET/KEY), which every
// S3-compatible server takes. Every request has a connect timeout (30 s) and a total one (10 min).
#pragma once

#include <string>

#include "common/status.h"

namespace trainctl::bench {

struct UploadTarget {
  std::string url;       // s3://bucket[/prefix]
  std::string endpoint;  // "": https://s3.<region>.amazonaws.com
  std::string region = "us-east-1";
};

// kInvalidArgument when the URL is not s3://bucket[/prefix] or the credentials are not set.
Status CheckUpload(const UploadTarget& target);

// Uploads every file under `dir` as <prefix>/<name>/<relative path>. Returns how many.
Result<int> UploadTree(const UploadTarget& target, const std::string& dir, const std::string& name);

}  // namespace trainctl::bench
