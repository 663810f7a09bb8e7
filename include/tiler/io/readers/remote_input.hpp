// remote_input: inputs that live on a server. `-i` takes https:// and http:// URLs, s3://bucket/key and
// gs://bucket/key; they are read by byte ranges through GDAL's VSI layer (/vsicurl/, /vsis3/, /vsigs/: its
// block cache, its credentials from AWS_* / GS_* / the instance's role, its retries and timeouts), never
// downloaded whole. A `.txt` file given as an input lists inputs, one a line. Promise: a read the server cuts
// short is an error naming the URL (never zeros, never a silent short image); a build without GDAL refuses a
// remote input as that image's error. No LibTorch, no GDAL types here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace tiler {

// The input is a URL tiler reads remotely: http://, https://, s3:// or gs://.
bool isRemoteInput(const std::string& input);
// The last element of the input's path, without a URL's query or fragment ("slide.svs" for
// "https://host/a/slide.svs?X-Amz-Signature=..."); a local path's file name.
std::string inputFileName(const std::string& input);
// inputFileName less its last extension: the stem of the input's output names.
std::string inputStem(const std::string& input);

// A named input that lists inputs: a file named *.txt.
bool isInputList(const std::string& path);
// The largest list of inputs read.
constexpr int64_t kMaxInputListBytes = int64_t(64) << 20;
// The inputs a list names, one a line (URLs or paths); blank lines and lines that start with '#' skipped,
// surrounding spaces trimmed. Throws IoError naming the file when it cannot be read, is no regular file or
// is over kMaxInputListBytes.
std::vector<std::string> readInputList(const std::string& path);

// One remote file open for reading (a GDAL VSI handle): not thread safe, one per reading thread.
class RemoteFile {
 public:
  // Opens `url` (isRemoteInput) and learns its size; throws IoError naming the URL and the server's or
  // GDAL's error, or saying that this build lacks GDAL.
  explicit RemoteFile(const std::string& url);
  ~RemoteFile();
  RemoteFile(const RemoteFile&) = delete;
  RemoteFile& operator=(const RemoteFile&) = delete;

  // Reads up to `n` bytes at the current position and moves past them: fewer only where the file ends.
  // A read the server cuts short returns -1, and takeError() says what happened.
  int64_t read(void* data, size_t n);
  void seek(uint64_t position) { position_ = position; }
  uint64_t position() const { return position_; }
  uint64_t size() const { return size_; }
  const std::string& url() const { return url_; }
  // Why the last read failed ("" when it did not), cleared.
  std::string takeError();

 private:
  std::string url_, error_;
  void* handle_ = nullptr;  // VSILFILE*
  uint64_t size_ = 0, position_ = 0;
};

// The bytes this process has fetched from each of `inputs` so far (GDAL's network statistics: what came
// over the network, not what the block cache served again), in their order; 0 for a local input, one never
// read, or without GDAL. One pass over the statistics for all: a job of thousands of URLs asks once.
std::vector<int64_t> remoteBytesFetched(const std::vector<std::string>& inputs);

}  // namespace tiler
