// writers/output_file: what every output file or store of an image is to the one commit protocol, and the
// plain text file most formats stream into. No LibTorch.
// Promise: an output is written under "<path>.partial" (its partial paths) and appears under its final name
// only through commitWriters(), which renames an image's set of writers all or nothing: every writer finished
// first (a failure renames none), then each renamed; a failed rename removes those already renamed. A writer
// destroyed uncommitted removes its partial paths, so nothing under a final name is ever incomplete. Every
// failure is an IoError naming the file.
#pragma once

#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tiler/io/image_io.hpp"

namespace tiler {

// One output file or store of an image, as the commit protocol sees it.
class OutputWriter {
 public:
  virtual ~OutputWriter() = default;
  // Phase one: everything written and closed under the partial name (throws IoError; nothing renamed then).
  virtual void finish() = 0;
  // Phase two: renamed into place; the final name is added to `renamed` (taken back if a later one fails).
  virtual void commit(std::vector<std::string>& renamed) = 0;
  // TILER_FAULT's write failure: true when the output's writes now fail as on a full disk; false when it has
  // no such fault (its stage fails the image itself).
  virtual bool failAsFullDisk() { return false; }
};

// One text (or raw bytes) output written under "<path>.partial" (created anew: a link or a file there is
// refused); removed when destroyed uncommitted. In an output directory in memory (memory_output.hpp) the
// bytes go to a buffer instead, kept there at commit.
class TextFile : public OutputWriter {
 public:
  explicit TextFile(std::string path);
  ~TextFile() override;
  TextFile(const TextFile&) = delete;
  TextFile& operator=(const TextFile&) = delete;
  void write(const std::string& text) { write(text.data(), text.size()); }
  void write(const void* data, size_t bytes);
  // Flushes, syncs to disk and closes.
  void finish() override { close(true); }
  // Flushes and closes; `durable`: synced to disk first (a scratch file, read back and removed, need not be).
  void close(bool durable);
  void commit(std::vector<std::string>& renamed) override;
  std::string partial() const { return path_ + ".partial"; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  FILE* file_ = nullptr;  // owned
  bool committed_ = false;
  char* memory_ = nullptr;  // in memory: open_memstream's buffer (owned), its size
  size_t memory_size_ = 0;
};

// An output that is one ImageWriter (a TIFF, or a PNG assembled in memory): its finish and commit.
class ImageOutput : public OutputWriter {
 public:
  explicit ImageOutput(std::unique_ptr<ImageWriter> writer) : writer_(std::move(writer)) {}
  ImageWriter& image() { return *writer_; }
  void finish() override { writer_->finish(); }
  void commit(std::vector<std::string>& renamed) override;

 private:
  std::unique_ptr<ImageWriter> writer_;
};

// Makes the directory output `path` goes into (none for one in memory).
void makeParentDirectory(const std::string& path);
// Renames `path`.partial to `path`.
void renameFromPartial(const std::string& path);
// Phase two of committing an image's outputs, all or nothing: `rename_all` renames each finished output into
// place, adding it to the list it is given; when one fails, those already renamed are removed (a file, or a
// store's directory) and the error goes on. Returns the final paths.
std::vector<std::string> commitAllOrNothing(
    const std::function<void(std::vector<std::string>& renamed)>& rename_all);
// The commit protocol: finishes every writer (null ones skipped), in order, then renames them all or none.
// Returns the final paths.
std::vector<std::string> commitWriters(const std::vector<OutputWriter*>& writers);

}  // namespace tiler
