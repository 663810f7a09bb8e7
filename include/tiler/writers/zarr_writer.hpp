// zarr_writer: OME-Zarr stores (OME-NGFF 0.4 over Zarr v2, chunk keys with "/"), streamed band by band as
// ImageWriter streams a TIFF. No LibTorch.
// Promise: a store holds the probabilities as the multiscale image at its root (array "0", then "1", "2", ...
// with a pyramid; shape (C, H, W), chunks (1, chunk, chunk)) and the labels as an image-label under
// labels/<name> (shape (1, H, W), the same chunks and levels); either may be absent. Pyramid levels are the
// TIFF pyramid's exactly: each half the previous through halve() (2x2 means; the labels' nearest), down to
// one chunk. Chunks are compressed (zstd or zlib, as numcodecs names them; `--compression`'s codec and level,
// else the TIFF outputs' defaults: zstd:1 for probabilities, zlib:1 for labels) as soon as a row of them is
// complete, on the pool when one is given, and written in order, so the bytes do not depend on the pool's
// threads; a chunk whose every byte is 0 (the fill value) is not written, as zarr's write_empty_chunks=False,
// and readers return the fill value there. Memory: per array, the row of chunks being filled and the one
// compressing, never the image. The store is built as "<path>.partial/", a directory made anew, its metadata
// written last; commit() renames it to <path> and never replaces what stands there; a writer destroyed or
// failed before commit removes its partial directory, so a store under its final name is always complete.
// Every failure is an IoError naming the store.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <opencv2/core.hpp>
#include <optional>
#include <string>
#include <vector>

#include "tiler/core/queue.hpp"
#include "tiler/io/image_io.hpp"

namespace tiler {

// A label value's or a channel's name and colour (the class palette, polygons.hpp's labelPalette).
struct ZarrClass {
  std::string name;
  std::array<uint8_t, 3> rgb{255, 255, 255};
};

// The probabilities: the image at the store's root.
struct ZarrProbabilities {
  int channels = 1;
  SampleType type = SampleType::kF32;  // u8, f16 or f32 (--probs_dtype): <f4, <f2, |u1
  // Channel c's name and colour, as the "omero" metadata viewers show (napari's layer names); empty: none.
  std::vector<ZarrClass> channel_classes;
  // A JSON object whose keys join the image's .zattrs (what the stored values mean: u8 is p x 255); "": none.
  std::string attributes;
};

// The labels: an image-label, labels/<name>, of one channel.
struct ZarrLabels {
  SampleType type = SampleType::kU8;  // an integer type (labelSampleType): |u1 or <u2
  std::string name = "classes";
  std::vector<ZarrClass> classes;  // label value k's name and colour: image-label colors and properties
};

struct ZarrOptions {
  int chunk = 256;            // the chunks' edge in y and x (the output tile)
  bool pyramid = false;       // levels, each half the previous, down to one chunk (WriterOptions::pyramid's)
  std::optional<double> mpp;  // micrometres per level-0 pixel: scales in micrometers; unset: in pixels
  // --compression: zstd:L -> zstd, deflate:L -> zlib (levels above 9 as 9), lzw (no Zarr codec) -> zlib:1,
  // none -> no compressor; unset: defaultCompression of each array's sample type and values.
  std::optional<Compression> compression;
  std::shared_ptr<WorkPool> pool;  // compresses chunks; null: the calling thread
  std::string name;                // the multiscales' name ("" : "probabilities")
  std::optional<ZarrProbabilities> probabilities;
  std::optional<ZarrLabels> labels;
};

class ZarrWriter {
 public:
  // Makes "<path>.partial/" anew: a stale partial directory (a crashed run's) is removed first; a symbolic
  // link or anything but a directory at either name is refused.
  ZarrWriter(const std::string& path, int64_t width, int64_t height, ZarrOptions options);
  ~ZarrWriter();
  ZarrWriter(const ZarrWriter&) = delete;
  ZarrWriter& operator=(const ZarrWriter&) = delete;

  // Appends band.rows rows, top to bottom, of the probabilities (HWC: width columns, their channels and type)
  // or of the labels (one channel of their type).
  void writeProbabilities(const cv::Mat& band);
  void writeLabels(const cv::Mat& band);
  // Writes the last chunks, then the metadata, still under the partial name; every row must have been given.
  // Throws IoError on failure (the partial directory is removed then).
  void finish();
  // Renames the finished store to its final name, which must not exist (a run with --overwrite removes the
  // old one first). Throws IoError on failure.
  void commit();
  const std::string& path() const { return path_; }
  std::string partialPath() const { return path_ + ".partial"; }
  // Bytes of every file written into the store (chunks and metadata): what the report counts.
  uint64_t bytesWritten() const { return bytes_written_; }
  // Rows of chunks held in memory, every level together (for memory tests).
  size_t bufferedBytes() const;
  // Fault injection (TILER_FAULT stage:write): every chunk compressed from now on throws.
  void injectChunkFault() { chunk_fault_->store(true); }

 private:
  class Array;  // one Zarr array: a level of an image
  class Image;  // one multiscale image: its levels, halved from the rows given
  void writeMetadata();
  void abandon() noexcept;
  template <typename F>
  void orAbandon(F step);  // runs step; on an exception removes the partial directory and rethrows

  std::string path_;
  int64_t width_, height_;
  ZarrOptions options_;
  std::unique_ptr<Image> probabilities_, labels_;
  std::shared_ptr<std::atomic<bool>> chunk_fault_ = std::make_shared<std::atomic<bool>>(false);
  uint64_t bytes_written_ = 0;
  bool finished_ = false;  // every chunk and the metadata written, under the partial name
  bool done_ = false;      // committed, or abandoned
};

}  // namespace tiler
