// The JPEG backend of the reader registry (readers.hpp): JPEG files decoded whole at open through libjpeg
// itself, not OpenCV, because OpenCV hides libjpeg's warnings: a file cut short or with corrupt data decodes
// "successfully" with grey where the data ended. Here any warning about the data fails the image, and the
// size a header claims is checked against the file's bytes before a pixel is allocated (a 629-byte JPEG
// claiming 20000x20000 took 33 s and 3 GB to decode to grey).
// setjmp/longjmp, as libjpeg wants: nothing between the setjmp and a longjmp owns a resource but the caller.
#include <cerrno>
#include <csetjmp>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <opencv2/core.hpp>

// After <cstddef> and <cstdio>: jpeglib.h uses size_t and FILE without including them.
#include <jpeglib.h>

// After jpeglib.h: its configuration says which warnings exist (arithmetic coding's).
#include <jerror.h>

#include "tiler/core/error.hpp"
#include "tiler/io/readers/readers.hpp"

namespace tiler {
namespace {

// The most pixels a JPEG's bytes can hold: baseline Huffman coding spends at least 2 bits on an 8x8 block
// (about 256 pixels a byte), progressive EOB runs about 1 bit (512); 4096 leaves room for arithmetic
// coding of flat images and refuses headers that claim far more than their file holds.
constexpr uint64_t kMaxPixelsPerByte = 4096;
// OpenCV's limit for an image decoded whole, kept: larger images belong in a tiled TIFF.
constexpr uint64_t kMaxPixels = uint64_t(1) << 30;

struct ErrorManager {
  jpeg_error_mgr mgr;  // first: libjpeg hands this struct's address around as a jpeg_error_mgr*
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

[[noreturn]] void failDecode(j_common_ptr cinfo) {
  auto* e = reinterpret_cast<ErrorManager*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, e->message);
  std::longjmp(e->jump, 1);
}

// A warning about the data means libjpeg substituted pixels; the others (an unknown JFIF revision, a bogus
// ICC profile, Adobe transform notes) change no pixel and are ignored.
void onMessage(j_common_ptr cinfo, int level) {
  if (level >= 0) return;  // trace messages
  switch (cinfo->err->msg_code) {
    case JWRN_ARITH_BAD_CODE:
    case JWRN_BOGUS_PROGRESSION:
    case JWRN_EXTRANEOUS_DATA:
    case JWRN_HIT_MARKER:
    case JWRN_HUFF_BAD_CODE:
    case JWRN_JPEG_EOF:
    case JWRN_MUST_RESYNC:
    case JWRN_NOT_SEQUENTIAL:
    case JWRN_TOO_MUCH_DATA:
      failDecode(cinfo);
    default:
      return;
  }
}

// Decodes `file` (of `file_bytes`) into `pixels` (RGB or grey, 8 bits). Returns "" or what failed.
// Plain C data only between setjmp and the decompressor's destruction.
std::string decode(std::FILE* file, uint64_t file_bytes, cv::Mat& pixels) {
  jpeg_decompress_struct cinfo;
  ErrorManager errors;
  cinfo.err = jpeg_std_error(&errors.mgr);
  errors.mgr.error_exit = failDecode;
  errors.mgr.emit_message = onMessage;
  errors.message[0] = '\0';
  char refused[256] = "";
  if (setjmp(errors.jump)) {
    jpeg_destroy_decompress(&cinfo);
    return refused[0] ? refused : errors.message;
  }
  jpeg_create_decompress(&cinfo);
  jpeg_stdio_src(&cinfo, file);
  jpeg_read_header(&cinfo, TRUE);
  const uint64_t pixels_claimed = uint64_t(cinfo.image_width) * cinfo.image_height;
  if (pixels_claimed > kMaxPixelsPerByte * file_bytes || pixels_claimed > kMaxPixels) {
    std::snprintf(
        refused, sizeof refused,
        "its header claims %ux%u pixels, %s (corrupt or forged; convert large images to tiled TIFF)",
        cinfo.image_width, cinfo.image_height,
        pixels_claimed > kMaxPixels ? "more than 2^30, the most decoded whole"
                                    : "more than its bytes can hold");
    std::longjmp(errors.jump, 1);
  }
  const bool grey = cinfo.jpeg_color_space == JCS_GRAYSCALE;
  if (cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK) {
    std::snprintf(refused, sizeof refused, "a CMYK JPEG (convert it to RGB)");
    std::longjmp(errors.jump, 1);
  }
  cinfo.out_color_space = grey ? JCS_GRAYSCALE : JCS_RGB;
  jpeg_start_decompress(&cinfo);
  pixels.create(int(cinfo.output_height), int(cinfo.output_width), grey ? CV_8UC1 : CV_8UC3);
  while (cinfo.output_scanline < cinfo.output_height) {
    JSAMPROW row = pixels.ptr<uint8_t>(int(cinfo.output_scanline));
    jpeg_read_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_decompress(&cinfo);
  jpeg_destroy_decompress(&cinfo);
  return "";
}

}  // namespace

bool identifyJpeg(const FileHead& head) {
  return head.startsWith("\xFF\xD8\xFF");  // the start-of-image marker and the next marker's first byte
}

std::unique_ptr<ImageReader> openJpeg(const std::string& path) {
  std::error_code ec;
  const uint64_t bytes = std::filesystem::file_size(path, ec);
  TILER_CHECK(!ec, IoError, "'" << path << "': " << ec.message());
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> file(std::fopen(path.c_str(), "rb"), std::fclose);
  TILER_CHECK(file, IoError, "'" << path << "': cannot open: " << std::strerror(errno));
  cv::Mat pixels;
  const std::string error = decode(file.get(), bytes, pixels);
  TILER_CHECK(error.empty(), IoError, "'" << path << "': not a readable JPEG: " << error);
  return decodedImage(path, std::move(pixels), "jpeg");
}

}  // namespace tiler
