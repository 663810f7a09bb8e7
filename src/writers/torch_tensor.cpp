#include "tiler/writers/torch_tensor.hpp"

#include <caffe2/serialize/inline_container.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <optional>

#include "tiler/core/error.hpp"

namespace tiler {

TorchTensorFile::TorchTensorFile(const std::string& path, int64_t dim)
    : dim_(dim), rows_(path + ".rows"), file_(path) {}

void TorchTensorFile::append(const float* values) {
  rows_.write(values, size_t(dim_) * sizeof(float));
  ++count_;
}

void TorchTensorFile::finish() {
  rows_.close(/*durable=*/false);
  const std::string rows = rows_.partial();
  const int fd = ::open(rows.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  TILER_CHECK(fd >= 0, IoError, "'" << rows << "': cannot reopen: " << std::strerror(errno));
  const size_t bytes = size_t(count_ * dim_) * sizeof(float);
  void* data = bytes == 0 ? nullptr : mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_errno = errno;
  ::close(fd);
  TILER_CHECK(data != MAP_FAILED, IoError, "'" << rows << "': cannot map: " << std::strerror(map_errno));
  try {
    store(data, bytes);
  } catch (...) {
    if (data) munmap(data, bytes);
    throw;
  }
  if (data) munmap(data, bytes);
  file_.finish();
}

// The archive through LibTorch's writer. Its writes never fail from its side (it would throw from its
// destructor): the first failed write is kept, the rest skipped, and thrown after.
void TorchTensorFile::store(const void* data, size_t bytes) {
  std::optional<IoError> failed;
  const auto write = [&](const void* buffer, size_t n) -> size_t {
    if (!failed) {
      try {
        file_.write(buffer, n);
      } catch (const IoError& e) {
        failed = e;
      }
    }
    return n;
  };
  try {
    caffe2::serialize::PyTorchStreamWriter writer(write);
    const std::string pickle = tensorPickle(count_, dim_);
    writer.writeRecord("data.pkl", pickle.data(), pickle.size());
    writer.writeRecord("byteorder", "little", 6);
    writer.writeRecord("data/0", data, bytes);
    writer.writeEndOfFile();
  } catch (const std::exception& e) {
    TILER_THROW(IoError, "'" << file_.partial() << "': cannot write the tensor archive: " << e.what());
  }
  if (failed) throw *failed;
}

namespace {

// BINUNICODE.
void pickleText(std::string& p, const std::string& s) {
  p += 'X';
  for (int i = 0; i < 4; ++i) p += char((s.size() >> (8 * i)) & 0xff);
  p += s;
}

// As Python's pickle writes ints: BININT1, BININT2, BININT, LONG1.
void pickleInteger(std::string& p, int64_t v) {
  if (v >= 0 && v <= 0xff) {
    p += 'K';
    p += char(v);
  } else if (v >= 0 && v <= 0xffff) {
    p += 'M';
    p += char(v & 0xff);
    p += char(v >> 8);
  } else if (v >= INT32_MIN && v <= INT32_MAX) {
    p += 'J';
    for (int i = 0; i < 4; ++i) p += char((uint64_t(v) >> (8 * i)) & 0xff);
  } else {
    p += "\x8a\x08";  // eight bytes, little-endian two's complement
    for (int i = 0; i < 8; ++i) p += char((uint64_t(v) >> (8 * i)) & 0xff);
  }
}

}  // namespace

// torch._utils._rebuild_tensor_v2(storage, offset, size, stride, requires_grad, hooks).
std::string tensorPickle(int64_t rows, int64_t dim) {
  std::string p = "\x80\x02";  // PROTO 2
  p += "ctorch._utils\n_rebuild_tensor_v2\n((";
  pickleText(p, "storage");
  p += "ctorch\nFloatStorage\n";
  pickleText(p, "0");
  pickleText(p, "cpu");
  pickleInteger(p, rows * dim);
  p += "tQ";            // TUPLE, BINPERSID: the storage record
  pickleInteger(p, 0);  // storage offset
  p += '(';
  pickleInteger(p, rows);
  pickleInteger(p, dim);
  p += "t(";
  pickleInteger(p, dim);
  pickleInteger(p, 1);
  p += "t\x89";                          // requires_grad False
  p += "ccollections\nOrderedDict\n)R";  // no backward hooks
  p += "tR.";
  return p;
}

}  // namespace tiler
