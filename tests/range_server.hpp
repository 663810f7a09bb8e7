// A local HTTP server with Range support (tests/range_server.py) for the remote-input tests: started on an
// ephemeral port, serving a directory, optionally cutting every response once it has sent a number of bytes
// (a lost connection) or answering its first requests 503 (busy), and counting the bytes it sent. Stopped
// when the object goes. And the file it serves.
#pragma once

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <opencv2/core.hpp>
#include <string>

#include "test_util.hpp"
#include "tiler/io/image_io.hpp"

namespace tiler::test {

// A pyramidal tiled TIFF of noise, uncompressed (3.9 MB at 1024 px: its bytes are its pixels, so a test can
// tell how much of it came over the network).
inline void writeNoiseTiff(const std::string& path, int side) {
  cv::Mat img(side, side, CV_8UC3);
  cv::randu(img, 0, 255);
  WriterOptions o;
  o.compression = parseCompression("none");
  o.pyramid = true;
  ImageWriter w(path, side, side, 3, SampleType::kU8, o);
  w.writeRows(img);
  w.close();
}

class RangeServer {
 public:
  // Serves `root`; `drop_after` >= 0: every response is cut once that many bytes have been sent in all;
  // `fail_first`: the first requests are answered 503 (busy).
  explicit RangeServer(const std::string& root, long drop_after = -1, int fail_first = 0)
      : count_file_(root + "/.served_" + std::to_string(servers_++)) {
    std::remove(count_file_.c_str());
    int out[2];
    if (pipe(out) != 0) return;
    pid_ = fork();
    if (pid_ == 0) {
      dup2(out[1], STDOUT_FILENO);
      close(out[0]);
      close(out[1]);
      const std::string script = std::string(TILER_TEST_SOURCE_DIR) + "/tests/range_server.py";
      const std::string drop = std::to_string(drop_after), fail = std::to_string(fail_first);
      execlp("python3", "python3", script.c_str(), "--root", root.c_str(), "--drop_after", drop.c_str(),
             "--count", count_file_.c_str(), "--fail_first", fail.c_str(), nullptr);
      _exit(127);
    }
    close(out[1]);
    // Its first line says where it listens ("port N"): it is ready then.
    FILE* lines = fdopen(out[0], "r");
    char line[64] = {0};
    if (lines && fgets(line, sizeof line, lines)) std::sscanf(line, "port %d", &port_);
    if (lines) fclose(lines);
    EXPECT_GT(port_, 0) << "tests/range_server.py did not start";
  }
  ~RangeServer() {
    if (pid_ <= 0) return;
    kill(pid_, SIGTERM);
    waitpid(pid_, nullptr, 0);
  }
  RangeServer(const RangeServer&) = delete;
  RangeServer& operator=(const RangeServer&) = delete;

  std::string url(const std::string& name) const {
    return "http://127.0.0.1:" + std::to_string(port_) + "/" + name;
  }
  // The body bytes sent so far.
  long bytesSent() const {
    const std::string text = slurp(count_file_);
    return text.empty() ? 0 : std::stol(text);
  }

 private:
  static inline int servers_ = 0;  // each its own count file
  std::string count_file_;
  pid_t pid_ = -1;
  int port_ = 0;
};

}  // namespace tiler::test
