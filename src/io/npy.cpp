// npy: the .npy reader (see the header). The format: "\x93NUMPY", major and minor version bytes, the header's
// length (2 bytes little-endian in version 1, 4 bytes in 2 and 3), then a Python dict literal with 'descr',
// 'fortran_order' and 'shape', padded with spaces to a 16- or 64-byte boundary, then the raw data.
#include "tiler/io/npy.hpp"

#include <cstring>

#include "tiler/core/error.hpp"
#include "tiler/core/platform.hpp"

namespace tiler {
namespace {

// The text of key `key`'s value in the header dict: what follows "'key':" up to the next top-level comma.
std::string headerValue(const std::string& header, const std::string& key, const std::string& path) {
  const std::string quoted = "'" + key + "'";
  size_t at = header.find(quoted);
  TILER_CHECK(at != std::string::npos, IoError, "'" << path << "': the .npy header has no " << quoted);
  at = header.find(':', at + quoted.size());
  TILER_CHECK(at != std::string::npos, IoError,
              "'" << path << "': the .npy header's " << quoted << " has no value");
  size_t end = at + 1;
  int depth = 0;
  for (; end < header.size(); ++end) {
    const char c = header[end];
    if (c == '(') ++depth;
    if (c == ')') --depth;
    if ((c == ',' && depth == 0) || c == '}') break;
  }
  std::string value = header.substr(at + 1, end - at - 1);
  value.erase(0, value.find_first_not_of(' '));
  value.erase(value.find_last_not_of(' ') + 1);
  return value;
}

std::vector<int64_t> parseShape(const std::string& text, const std::string& path) {
  TILER_CHECK(text.size() >= 2 && text.front() == '(' && text.back() == ')', IoError,
              "'" << path << "': the .npy shape " << text << " is not a tuple");
  std::vector<int64_t> shape;
  std::string inner = text.substr(1, text.size() - 2);
  size_t start = 0;
  while (start < inner.size()) {
    size_t comma = inner.find(',', start);
    if (comma == std::string::npos) comma = inner.size();
    std::string item = inner.substr(start, comma - start);
    item.erase(0, item.find_first_not_of(' '));
    item.erase(item.find_last_not_of(' ') + 1);
    if (!item.empty()) {
      TILER_CHECK(item.find_first_not_of("0123456789") == std::string::npos && item.size() <= 12, IoError,
                  "'" << path << "': the .npy shape " << text << " holds '" << item << "'");
      shape.push_back(std::stoll(item));
    }
    start = comma + 1;
  }
  return shape;
}

template <typename T>
void convert(const char* bytes, size_t count, std::vector<double>& out) {
  out.resize(count);
  for (size_t i = 0; i < count; ++i) {
    T v;
    std::memcpy(&v, bytes + i * sizeof(T), sizeof(T));
    out[i] = double(v);
  }
}

// The element size of a dtype this reader takes; 0 for any other.
size_t elementSize(const std::string& dtype) {
  static const char* const k1[] = {"|u1", "<u1", "|i1", "<i1"};
  for (const char* d : k1)
    if (dtype == d) return 1;
  if (dtype == "<u2" || dtype == "<i2") return 2;
  if (dtype == "<f4" || dtype == "<i4" || dtype == "<u4") return 4;
  if (dtype == "<f8" || dtype == "<i8") return 8;
  return 0;
}

void decode(const std::string& dtype, const char* bytes, size_t count, std::vector<double>& out) {
  const char kind = dtype[1], size = dtype[2];
  if (kind == 'f')
    return size == '4' ? convert<float>(bytes, count, out) : convert<double>(bytes, count, out);
  if (kind == 'u') {
    if (size == '1') return convert<uint8_t>(bytes, count, out);
    return size == '2' ? convert<uint16_t>(bytes, count, out) : convert<uint32_t>(bytes, count, out);
  }
  if (size == '1') return convert<int8_t>(bytes, count, out);
  if (size == '2') return convert<int16_t>(bytes, count, out);
  return size == '4' ? convert<int32_t>(bytes, count, out) : convert<int64_t>(bytes, count, out);
}

}  // namespace

NpyArray readNpy(const std::string& path, int64_t max_bytes) {
  std::string why;
  const auto read = readDocument(path, max_bytes, why);
  TILER_CHECK(read, IoError, "'" << path << "': " << why);
  return parseNpy(*read, path);
}

NpyArray parseNpy(const std::string& bytes, const std::string& path) {
  TILER_CHECK(bytes.size() >= 10 && bytes.compare(0, 6, "\x93NUMPY") == 0, IoError,
              "'" << path << "': not a .npy file (no \\x93NUMPY magic)");
  const int major = uint8_t(bytes[6]);
  TILER_CHECK(major >= 1 && major <= 3, IoError,
              "'" << path << "': .npy format version " << major << " is unknown");
  const size_t length_bytes = major == 1 ? 2 : 4;
  TILER_CHECK(bytes.size() >= 8 + length_bytes, IoError, "'" << path << "': the .npy header is cut short");
  size_t header_length = 0;
  for (size_t i = 0; i < length_bytes; ++i) header_length |= size_t(uint8_t(bytes[8 + i])) << (8 * i);
  const size_t data_at = 8 + length_bytes + header_length;
  TILER_CHECK(data_at <= bytes.size(), IoError,
              "'" << path << "': the .npy header says " << header_length << " bytes; the file ends before");
  const std::string header = bytes.substr(8 + length_bytes, header_length);
  NpyArray array;
  const std::string descr = headerValue(header, "descr", path);
  array.dtype = descr.size() >= 2 ? descr.substr(1, descr.size() - 2) : descr;
  TILER_CHECK(headerValue(header, "fortran_order", path) == "False", IoError,
              "'" << path << "': a Fortran-order array; tiler reads C order (numpy.ascontiguousarray)");
  const size_t element = elementSize(array.dtype);
  TILER_CHECK(element > 0, IoError,
              "'" << path << "': dtype " << descr
                  << " is not read (little-endian f4, f8, i1, u1, i2, u2, i4, u4 and i8 are)");
  array.shape = parseShape(headerValue(header, "shape", path), path);
  size_t count = 1;
  for (int64_t d : array.shape) {
    TILER_CHECK(d == 0 || count <= (size_t(1) << 40) / size_t(d), IoError,
                "'" << path << "': the .npy shape is too large");
    count *= size_t(d);
  }
  TILER_CHECK(bytes.size() - data_at == count * element, IoError,
              "'" << path << "': the shape and dtype need " << count * element
                  << " bytes of data, the file holds " << bytes.size() - data_at);
  decode(array.dtype, bytes.data() + data_at, count, array.values);
  return array;
}

std::string numpyTypestr(SampleType type) {
  static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the typestrs name little-endian data");
  const size_t bytes = bytesPerSample(type);
  return std::string(bytes == 1 ? "|" : "<") + sampleTypeName(type)[0] + std::to_string(bytes);
}

}  // namespace tiler
