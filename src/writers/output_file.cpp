#include "tiler/writers/output_file.hpp"

#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "tiler/core/error.hpp"
#include "tiler/core/platform.hpp"
#include "tiler/writers/memory_output.hpp"

namespace fs = std::filesystem;

namespace tiler {

TextFile::TextFile(std::string path) : path_(std::move(path)) {
  if (isMemoryOutput(path_)) {
    file_ = open_memstream(&memory_, &memory_size_);
    TILER_CHECK(file_ != nullptr, IoError,
                "'" << path_ << "': cannot open in memory: " << std::strerror(errno));
    return;
  }
  const int fd = createFileExclusively(partial());
  TILER_CHECK(fd >= 0, IoError, "'" << partial() << "': cannot create: " << std::strerror(errno));
  file_ = fdopen(fd, "w");
  if (file_ == nullptr) {
    ::close(fd);
    TILER_THROW(IoError, "'" << partial() << "': cannot open: " << std::strerror(errno));
  }
}

TextFile::~TextFile() {
  if (file_) std::fclose(file_);
  std::free(memory_);
  std::error_code ec;
  if (!committed_ && !isMemoryOutput(path_)) fs::remove(partial(), ec);
}

void TextFile::write(const void* data, size_t bytes) {
  if (bytes == 0) return;  // data may be null then (an empty tensor's storage)
  TILER_CHECK(std::fwrite(data, 1, bytes, file_) == bytes, IoError,
              "'" << partial() << "': write failed: " << std::strerror(errno));
}

void TextFile::close(bool durable) {
  const bool ok =
      std::fflush(file_) == 0 && (!durable || isMemoryOutput(path_) || ::fsync(fileno(file_)) == 0);
  const int err = errno;
  const bool closed = std::fclose(file_) == 0;
  file_ = nullptr;
  TILER_CHECK(ok && closed, IoError, "'" << partial() << "': write failed: " << std::strerror(err));
}

void TextFile::commit(std::vector<std::string>& renamed) {
  if (isMemoryOutput(path_))
    keepMemoryText(path_, std::string(memory_ ? memory_ : "", memory_size_));
  else
    renameFromPartial(path_);
  committed_ = true;
  renamed.push_back(path_);
}

void ImageOutput::commit(std::vector<std::string>& renamed) {
  writer_->commit();
  renamed.push_back(writer_->path());
}

void makeParentDirectory(const std::string& path) {
  if (!isMemoryOutput(path)) fs::create_directories(fs::path(path).parent_path());
}

void renameFromPartial(const std::string& path) {
  const std::string partial = path + ".partial";
  TILER_CHECK(std::rename(partial.c_str(), path.c_str()) == 0, IoError,
              "'" << path << "': rename from .partial failed: " << std::strerror(errno));
}

std::vector<std::string> commitAllOrNothing(
    const std::function<void(std::vector<std::string>& renamed)>& rename_all) {
  std::vector<std::string> renamed;
  try {
    rename_all(renamed);
  } catch (...) {
    for (const auto& path : renamed) removeTree(path);  // a file, or a store's directory
    throw;
  }
  return renamed;
}

std::vector<std::string> commitWriters(const std::vector<OutputWriter*>& writers) {
  for (OutputWriter* writer : writers)
    if (writer) writer->finish();
  return commitAllOrNothing([&](std::vector<std::string>& renamed) {
    for (OutputWriter* writer : writers)
      if (writer) writer->commit(renamed);
  });
}

}  // namespace tiler
