// End-to-end tests of `tiler infer`'s segmentation maps: the report, the outputs' sizes and types, TTA,
// --config, read threads and device stitching, codec budgets, zarr stores, pyramids, tissue and file masks,
// ROIs.
#include "pipeline_util.hpp"

#include <tiffio.h>

#include <cmath>
#include <fstream>
#include <map>
#include <opencv2/imgproc.hpp>

#include "tiler/core/cpu_layout.hpp"
#include "tiler/core/platform.hpp"

namespace tiler::e2e {
namespace {

TEST_F(Pipeline, ReportHasEveryField) {
  auto j = report(reference());
  for (const char* key : {"world_size", "backend", "device", "precision", "seconds", "windows_total",
                          "windows_per_second", "per_rank", "images", "gather"})
    EXPECT_TRUE(j.contains(key)) << key;
  EXPECT_EQ(j["backend"], "gloo");
  EXPECT_EQ(j["device"], "cpu");
  EXPECT_EQ(j["precision"], "fp32");
  for (const char* key : {"rank", "windows", "read_seconds", "forward_seconds", "gather_seconds",
                          "peak_rss_mb", "tiles_decoded", "write_seconds", "bytes_written", "images_owned"})
    EXPECT_TRUE(j["per_rank"][0].contains(key)) << key;
  EXPECT_EQ(j["shard_run"], j["windows_total"]) << "one rank: every window in a row";
  ASSERT_EQ(j["images"].size(), 5u);
  int64_t windows = 0;
  for (const auto& img : j["images"]) {
    EXPECT_EQ(img["status"], "ok") << img.dump();
    windows += img["windows"].get<int64_t>();
    for (const char* kind : {"labels", "probs"})
      EXPECT_TRUE(fs::exists(img["outputs"][kind].get<std::string>()));
  }
  EXPECT_EQ(j["windows_total"], windows);
  EXPECT_EQ(j["per_rank"][0]["windows"], windows);
  auto small = j["images"][2];
  EXPECT_EQ(small["width"], 50);
  EXPECT_EQ(small["windows"], 1) << "an image smaller than the window is padded to one window";
}

TEST_F(Pipeline, OutputsHaveTheInputsSizeAndTypes) {
  const std::string ref = reference();
  auto labels = ImageReader::open(ref + "/a_large_labels.tif");
  EXPECT_EQ(labels->info().width, 700);
  EXPECT_EQ(labels->info().height, 500);
  EXPECT_EQ(labels->info().type, SampleType::kU8);
  auto probs = ImageReader::open(ref + "/c_small_probs.tif");
  EXPECT_EQ(probs->info().width, 50);
  EXPECT_EQ(probs->info().channels, 2);
  EXPECT_EQ(probs->info().type, SampleType::kF32);
  // Labels are the argmax of the stored probabilities.
  auto p = ImageReader::open(ref + "/a_large_probs.tif")->readRegion({0, 0, 700, 500});
  auto l = labels->readRegion({0, 0, 700, 500});
  int mismatches = 0;
  for (int y = 0; y < 500; ++y)
    for (int x = 0; x < 700; ++x) {
      const float* v = p.ptr<float>(y) + x * 2;
      mismatches += (v[1] > v[0] ? 1 : 0) != l.ptr<uint8_t>(y)[x];
    }
  EXPECT_EQ(mismatches, 0);
}

TEST_F(Pipeline, TtaIsReportedAndD4NeedsSquareWindows) {
  const std::string out = root_ + "/out_tta";
  auto r = run(kTiler + " -i " + root_ + "/images/b_mixed.png -m " + model_ + " -o " + out +
               " --window 64 --threads 1 --no_progress --save labels,probs --tta d4");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(report(out)["tta"], "d4");
  EXPECT_EQ(report(reference())["tta"], "none");
  r = run(kTiler + " -i " + root_ + "/images/b_mixed.png -m " + model_ + " -o " + out +
          "_rect --window 64,32 --threads 1 --no_progress --tta d4");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.output.find("--tta d4 rotates windows, so they must be square"), std::string::npos) << r.output;
}

TEST_F(Pipeline, ConfigFileTakesAnyFlag) {
  const std::string out = root_ + "/out_config";
  const std::string cfg = root_ + "/run.toml";
  std::ofstream(cfg)
      << "window = \"128\"\nbatch_size = 4\nthreads = 1\nsave = \"labels,probs\"\nno_progress = true\n"
      << "output = \"" << out << "\"\nmodel = \"" << model_ << "\"\ninput = [\"" << root_ << "/images\"]\n";
  auto r = run(kTiler + " --config " + cfg);
  ASSERT_EQ(r.code, 0) << r.output;
  expectSameOutputs(reference(), out);
}

// The read threads of a rank (one, or the loader thread and two helpers) write the bytes of the default.
TEST_F(Pipeline, ReadThreadsWriteTheSameBytes) {
  const std::string ref = reference();
  EXPECT_EQ(report(ref)["read_threads"],
            chooseReadThreads(0, ForwardLayout{1, 1}, false, defaultIntraOpThreads()));
  for (int threads : {1, 3}) {
    const std::string out = root_ + "/out_read_threads" + std::to_string(threads);
    auto r = run(tilerArgs(out, "--read_threads " + std::to_string(threads)));
    ASSERT_EQ(r.code, 0) << r.output;
    expectSameOutputs(ref, out);
    EXPECT_EQ(report(out)["read_threads"], threads);
  }
}

// --stitch device blends on the model's device (here the CPU's, the same LibTorch operations a GPU runs):
// the host's bytes, on one rank and on two whose gather reaches that device (gloo between CPU ranks, as
// NCCL between GPUs); an image whose accumulator is out of memory is stitched on the host, saying so.
TEST_F(Pipeline, StitchingOnTheDeviceWritesTheHostsBytes) {
  const std::string ref = reference();
  EXPECT_EQ(report(ref)["stitch"], "host") << "auto on a CPU";
  const std::string out = root_ + "/out_stitch_device";
  auto r = run(tilerArgs(out, "--stitch device"));
  ASSERT_EQ(r.code, 0) << r.output;
  expectSameOutputs(ref, out);
  EXPECT_EQ(report(out)["stitch"], "device");
  const std::string oom = root_ + "/out_stitch_oom";
  r = run("TILER_FAULT=rank:0,after_windows:1,kind:oom,stage:stitch " + tilerArgs(oom, "--stitch device"));
  ASSERT_EQ(r.code, 0) << r.output;
  expectSameOutputs(ref, oom);
  EXPECT_NE(r.output.find("stitched on the host: cpu is out of memory for its accumulator"),
            std::string::npos)
      << r.output;
  const std::string two = root_ + "/out_stitch_two_ranks";
  runCtrun(2, two, "--stitch device");
  expectSameOutputs(ref, two);
  EXPECT_EQ(report(two)["stitch"], "device");
}

// A 2400x1800 slide: light glass with one stained disc (radius 300 at 1600,1200), ~9% tissue.
void writeTissueSlide(const std::string& path) {
  cv::Mat img(1800, 2400, CV_8UC3);
  cv::randu(img, cv::Scalar(228, 228, 232), cv::Scalar(240, 240, 245));
  cv::Mat disc = cv::Mat::zeros(1800, 2400, CV_8U);
  cv::circle(disc, {1600, 1200}, 300, 255, cv::FILLED);
  cv::Mat stain(1800, 2400, CV_8UC3);
  cv::randu(stain, cv::Scalar(150, 60, 140), cv::Scalar(200, 110, 190));
  stain.copyTo(img, disc);
  writeImage(path, img, SampleType::kU8);
}

TEST_F(Pipeline, TissueMaskSkipsGlassAndKeepsTissueExact) {
  const std::string in = root_ + "/slide_in";
  fs::create_directories(in);
  writeTissueSlide(in + "/slide.tif");
  auto args = [&](const std::string& out, const std::string& extra) {
    return kTiler + " -i " + in + " -m " + model_ + " -o " + out +
           " --window 128 --batch_size 4 --threads 1 --save labels,probs --no_progress " + extra;
  };
  const std::string full = root_ + "/slide_full", one = root_ + "/slide_masked1",
                    two = root_ + "/slide_masked2";
  ASSERT_EQ(run(args(full, "")).code, 0);
  auto r1 = run(args(one, "--mask auto"));
  ASSERT_EQ(r1.code, 0) << r1.output;
  auto r2 = run(kCtrun + " --nproc_per_node 2 --master_port 0 " + args(two, "--mask auto"));
  ASSERT_EQ(r2.code, 0) << r2.output;
  for (const char* f : {"/slide_labels.tif", "/slide_probs.tif"})
    EXPECT_TRUE(slurp(one + f) == slurp(two + f)) << f << ": 2 ranks = 1 rank";
  auto j = report(one)["images"][0];
  EXPECT_EQ(j["windows"], 475) << "25 x 19";
  EXPECT_EQ(j["windows"].get<int64_t>(),
            j["windows_processed"].get<int64_t>() + j["windows_skipped"].get<int64_t>());
  // The disc's windows: about (600+128)^2 / 96^2 of them, against 475 in the grid.
  EXPECT_GT(j["windows_processed"].get<int64_t>(), 30);
  EXPECT_LT(j["windows_processed"].get<int64_t>(), 90);
  EXPECT_EQ(j["mask"]["method"], "tissue");
  EXPECT_NEAR(j["mask"]["coverage"].get<double>(), M_PI * 300 * 300 / (2400.0 * 1800.0), 0.01);
  EXPECT_EQ(report(one)["windows_total"], j["windows_processed"]);
  // tiler info plans as infer does (the catalog's description): the same windows kept, the same coverage.
  auto info = run(kTiler + " info " + in + "/slide.tif --window 128 --mask auto --mask_preview " + root_ +
                  "/slide_mask.png");
  ASSERT_EQ(info.code, 0) << info.output;
  EXPECT_NE(info.output.find("mask: tissue, coverage 6.5%, " + j["windows_processed"].dump() +
                             " of 475 windows kept at --mask_fraction 0.05"),
            std::string::npos)
      << info.output;
  EXPECT_TRUE(fs::exists(root_ + "/slide_mask.png"));
  cv::Mat masked = ImageReader::open(one + "/slide_probs.tif")->readRegion({0, 0, 2400, 1800});
  cv::Mat unmasked = ImageReader::open(full + "/slide_probs.tif")->readRegion({0, 0, 2400, 1800});
  // Glass far from the disc: no window, zeros. The disc's centre: every covering window kept, exact.
  EXPECT_EQ(cv::countNonZero(masked(cv::Rect(0, 0, 1000, 700)).reshape(1)), 0);
  cv::Mat centre = masked(cv::Rect(1520, 1120, 160, 160)) != unmasked(cv::Rect(1520, 1120, 160, 160));
  EXPECT_EQ(cv::countNonZero(centre.reshape(1)), 0);
  cv::Mat labels = ImageReader::open(one + "/slide_labels.tif")->readRegion({0, 0, 2400, 1800});
  EXPECT_EQ(cv::countNonZero(labels(cv::Rect(0, 0, 1000, 700))), 0);
}

TEST_F(Pipeline, MaskFilesAtLowResolutionAndAnEmptyMask) {
  const std::string in = root_ + "/maskfile_in";
  fs::create_directories(in);
  fs::copy_file(root_ + "/images/a_large.tif", in + "/a_large.tif", fs::copy_options::overwrite_existing);
  // 1/16 of 700x500 (44x32): the left quarter of the image.
  cv::Mat mask = cv::Mat::zeros(32, 44, CV_8U);
  mask.colRange(0, 11).setTo(255);
  writeImage(root_ + "/quarter.png", mask, SampleType::kU8);
  const std::string out = root_ + "/maskfile_out";
  auto r =
      run(kTiler + " -i " + in + " -m " + model_ + " -o " + out + " --window 128 --threads 1 --no_progress " +
          "--mask " + root_ + "/quarter.png --mask_fraction 0.5");
  ASSERT_EQ(r.code, 0) << r.output;
  auto j = report(out)["images"][0];
  EXPECT_EQ(j["windows"], 35);
  EXPECT_EQ(j["windows_processed"], 10) << "the first two of 7 columns, 5 rows";
  // A mask with nothing inside: the outputs are written, all zero.
  writeImage(root_ + "/empty_mask.png", cv::Mat::zeros(10, 10, CV_8U), SampleType::kU8);
  const std::string empty = root_ + "/maskfile_empty";
  auto e = run(kTiler + " -i " + in + " -m " + model_ + " -o " + empty +
               " --window 128 --threads 1 --no_progress " + "--mask " + root_ + "/empty_mask.png");
  ASSERT_EQ(e.code, 0) << e.output;
  EXPECT_EQ(report(empty)["images"][0]["windows_processed"], 0);
  cv::Mat labels = ImageReader::open(empty + "/a_large_labels.tif")->readRegion({0, 0, 700, 500});
  EXPECT_EQ(cv::countNonZero(labels), 0);
  // A missing mask fails that image, not the run.
  auto m = run(kTiler + " -i " + in + " -m " + model_ + " -o " + root_ + "/maskfile_missing --window 128 " +
               "--no_progress --mask " + root_ + "/no_such_mask.png");
  EXPECT_EQ(m.code, 2) << m.output;
  EXPECT_NE(m.output.find("no_such_mask.png"), std::string::npos) << m.output;
}

// The Tumor annotations of a QuPath export (tests/data/qupath_annotations.geojson: two polygons, one with a
// hole; a Stroma annotation, a detection and a point besides) and the same region drawn as a raster mask
// file.
TEST_F(Pipeline, AnRoiRunEqualsItsRasterMaskRun) {
  const std::string in = root_ + "/roi_in", rois = root_ + "/roi_dir";
  fs::create_directories(in);
  fs::create_directories(rois);
  fs::copy_file(root_ + "/images/a_large.tif", in + "/a_large.tif", fs::copy_options::overwrite_existing);
  fs::copy_file(std::string(TILER_TEST_SOURCE_DIR) + "/tests/data/qupath_annotations.geojson",
                rois + "/a_large.geojson", fs::copy_options::overwrite_existing);
  cv::Mat mask = cv::Mat::zeros(500, 700, CV_8U);
  mask(cv::Rect(20, 30, 280, 220)).setTo(255);
  mask(cv::Rect(100, 80, 100, 100)).setTo(0);
  mask(cv::Rect(400, 300, 250, 180)).setTo(255);
  writeImage(root_ + "/roi_mask.png", mask, SampleType::kU8);
  auto args = [&](const std::string& out, const std::string& extra) {
    return kTiler + " -i " + in + " -m " + model_ + " -o " + out +
           " --window 64 --batch_size 4 --threads 1 --save labels,probs --mask_fraction 0.3 --no_progress " +
           extra;
  };
  const std::string by_roi = root_ + "/roi_out", by_mask = root_ + "/roi_mask_out";
  auto r = run(args(by_roi, "--roi " + rois + " --roi_class Tumor"));
  ASSERT_EQ(r.code, 0) << r.output;
  auto m = run(args(by_mask, "--mask " + root_ + "/roi_mask.png"));
  ASSERT_EQ(m.code, 0) << m.output;
  auto jr = report(by_roi)["images"][0], jm = report(by_mask)["images"][0];
  EXPECT_EQ(jr["mask"]["method"], "roi");
  EXPECT_EQ(jm["mask"]["method"], "file");
  EXPECT_EQ(jr["mask"]["coverage"], jm["mask"]["coverage"]);
  EXPECT_EQ(jr["windows_processed"], jm["windows_processed"]);
  EXPECT_LT(jr["windows_processed"].get<int64_t>(), jr["windows"].get<int64_t>() / 2);
  for (const char* f : {"/a_large_labels.tif", "/a_large_probs.tif"})
    EXPECT_TRUE(slurp(by_roi + f) == slurp(by_mask + f))
        << f << ": the ROI's outputs are the mask's, byte for byte";
  // A bad ROI fails that image (exit 2) naming the file and the problem; the run goes on.
  std::ofstream(root_ + "/roi_bad.geojson") << R"({"type": "Feature", "properties": {},
    "geometry": {"type": "Polygon", "coordinates": [[[0, 0], [1, 0], [0, 0]]]}})";
  auto bad = run(args(root_ + "/roi_bad_out", "--roi " + root_ + "/roi_bad.geojson"));
  EXPECT_EQ(bad.code, 2) << bad.output;
  EXPECT_NE(bad.output.find("roi_bad.geojson': feature 0, ring 0: 3 position(s)"), std::string::npos)
      << bad.output;
  auto none = run(args(root_ + "/roi_none_out", "--roi " + rois + " --roi_class Necrosis"));
  EXPECT_EQ(none.code, 2) << none.output;
  EXPECT_NE(none.output.find("no feature of class 'Necrosis'"), std::string::npos) << none.output;
}

// Every file under `dir`, by its path inside it, with its bytes.
std::map<std::string, std::string> filesUnder(const std::string& dir) {
  std::map<std::string, std::string> files;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) files[fs::relative(e.path(), dir).string()] = slurp(e.path().string());
  return files;
}

// The suite's job with `flags` for its --save (tilerArgs saves labels and probs).
std::string zarrJob(const std::string& root, const std::string& model, const std::string& out,
                    const std::string& flags) {
  return kTiler + " -i " + root + "/images -m " + model + " -o " + out +
         " --window 128 --batch_size 4 --threads 1 --no_progress " + flags;
}

// --save zarr: one writer file and a registry row. The store holds what the TIFF outputs of the same run
// hold, level for level, as zarr and GDAL read them, and the same bytes for any world size.
TEST_F(Pipeline, ZarrStoresHoldTheTiffOutputsAndAreTheSameOnOneAndTwoRanks) {
  const std::string one = root_ + "/out_zarr1", two = root_ + "/out_zarr2";
  const std::string flags = "--save labels,probs,zarr --pyramid --probs_dtype u8";
  auto r = run(zarrJob(root_, model_, one, flags));
  ASSERT_EQ(r.code, 0) << r.output;
  r = run(kCtrun + " --nproc_per_node 2 --master_port 0 " + zarrJob(root_, model_, two, flags));
  ASSERT_EQ(r.code, 0) << r.output;
  const auto j = report(one);
  for (const char* stem : {"a_large", "b_mixed", "c_small", "d_gray16", "e_float"}) {
    const std::string store = std::string(stem) + ".ome.zarr";
    ASSERT_TRUE(fs::is_directory(one + "/" + store)) << store;
    const auto files = filesUnder(one + "/" + store);
    EXPECT_GT(files.size(), 6u) << store;
    EXPECT_TRUE(files == filesUnder(two + "/" + store)) << store << ": 1 and 2 ranks differ";
  }
  EXPECT_TRUE(partialFiles(one).empty());
  EXPECT_EQ((*imageEntry(j, "a_large.tif"))["outputs"]["zarr"], one + "/a_large.ome.zarr");
  if (run("/usr/bin/python3 -c 'import zarr, numpy; from osgeo import gdal'").code != 0)
    GTEST_SKIP() << "python3-zarr or python3-gdal missing: the stores were not read by zarr and GDAL";
  // Each level of each TIFF (GDAL: the page, then its overviews) equals the store's array of that level.
  auto py =
      run("cd " + one +
          " && /usr/bin/python3 -c \"\n"
          "import zarr, numpy as np\n"
          "from osgeo import gdal\n"
          "for stem in ['a_large', 'b_mixed', 'c_small', 'd_gray16', 'e_float']:\n"
          "    g = zarr.open_group(stem + '.ome.zarr', 'r')\n"
          "    levels = len(g.attrs['multiscales'][0]['datasets'])\n"
          "    for kind, array in (('probs', ''), ('labels', 'labels/classes/')):\n"
          "        ds = gdal.Open(stem + '_' + kind + '.tif')\n"
          "        bands = [ds.GetRasterBand(b + 1) for b in range(ds.RasterCount)]\n"
          "        assert bands[0].GetOverviewCount() + 1 == levels, (stem, levels)\n"
          "        for k in range(levels):\n"
          "            tif = [b if k == 0 else b.GetOverview(k - 1) for b in bands]\n"
          "            z = g[array + str(k)][:]\n"
          "            assert z.shape == (len(tif), tif[0].YSize, tif[0].XSize), (stem, kind, k, z.shape)\n"
          "            for c, b in enumerate(tif):\n"
          "                assert np.array_equal(z[c], b.ReadAsArray()), (stem, kind, k, c)\n"
          "print('stores equal')\n\"");
  EXPECT_EQ(py.code, 0) << py.output;
  EXPECT_NE(py.output.find("stores equal"), std::string::npos) << py.output;
  if (have("gdalinfo")) {
    auto info = run("gdalinfo " + one + "/a_large.ome.zarr");
    EXPECT_EQ(info.code, 0) << info.output;
    EXPECT_NE(info.output.find("Driver: Zarr"), std::string::npos) << info.output;
  }
}

// A store appears whole or not at all: a failure while compressing it leaves nothing; a link at its name is
// refused (the link's target untouched); --resume skips finished stores and sweeps a dead run's partial one.
TEST_F(Pipeline, AZarrStoreIsAllOrNothing) {
  const std::string out = root_ + "/out_zarr_faults", victim = root_ + "/zarr_victim";
  auto r = run("TILER_FAULT=rank:0,after_windows:6,kind:throw,stage:write " +
               zarrJob(root_, model_, out, "--save zarr"));
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_FALSE(fs::exists(out + "/a_large.ome.zarr"));
  EXPECT_FALSE(fs::exists(out + "/a_large.ome.zarr.partial"));
  EXPECT_TRUE(fs::is_directory(out + "/b_mixed.ome.zarr"));
  // The next run redoes the failed image only; a dead run's partial store goes, and an empty directory at a
  // store's name (no .zattrs: no store) is redone, not taken as finished.
  fs::create_directories(out + "/c_small.ome.zarr.partial/0");
  const std::string d_store = out + "/d_gray16.ome.zarr";
  removeTree(d_store);
  fs::create_directory(d_store);
  r = run(zarrJob(root_, model_, out, "--save zarr --resume"));
  EXPECT_EQ(r.code, 0) << r.output;
  auto j = report(out);
  EXPECT_EQ((*imageEntry(j, "a_large.tif"))["status"], "ok");
  EXPECT_EQ((*imageEntry(j, "d_gray16.tif"))["status"], "ok") << "an empty directory is no finished store";
  EXPECT_TRUE(fs::exists(d_store + "/.zattrs"));
  EXPECT_EQ((*imageEntry(j, "b_mixed.png"))["status"], "skipped");
  EXPECT_FALSE(fs::exists(out + "/c_small.ome.zarr.partial"));
  // A link planted at a store's name is never written through, nor replaced.
  fs::create_directories(victim);
  std::ofstream(victim + "/keep") << "mine";
  removeTree(out + "/b_mixed.ome.zarr");
  fs::create_directory_symlink(victim, out + "/b_mixed.ome.zarr");
  r = run(zarrJob(root_, model_, out, "--save zarr --overwrite"));
  EXPECT_EQ(r.code, 2) << r.output;
  j = report(out);
  EXPECT_NE((*imageEntry(j, "b_mixed.png"))["error"].get<std::string>().find("symbolic link"),
            std::string::npos)
      << j.dump();
  EXPECT_TRUE(fs::is_symlink(out + "/b_mixed.ome.zarr"));
  EXPECT_EQ(filesUnder(victim), (std::map<std::string, std::string>{{"keep", "mine"}}));
  EXPECT_EQ((*imageEntry(j, "a_large.tif"))["status"], "ok") << "--overwrite replaces a store of its own";
}

TEST_F(Pipeline, PyramidsAndPalettesOpenInGdalVipsAndOpenSlide) {
  const std::string out = root_ + "/pyramid_out";
  auto r = run(kTiler + " -i " + root_ + "/images/a_large.tif -m " + model_ + " -o " + out +
               " --window 128 --threads 1 --no_progress --save labels,probs --pyramid --classes glass,blob");
  ASSERT_EQ(r.code, 0) << r.output;
  // 700x500 with 256 px tiles: 350x250, then 175x125 fits one tile: 3 pages.
  for (const char* f : {"/a_large_labels.tif", "/a_large_probs.tif"}) {
    TIFF* t = TIFFOpen((out + f).c_str(), "r");
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(TIFFNumberOfDirectories(t), 3) << f;
    TIFFClose(t);
  }
  // Level 0 is unchanged by the pyramid.
  cv::Mat with = ImageReader::open(out + "/a_large_probs.tif")->readRegion({0, 0, 700, 500});
  cv::Mat without = ImageReader::open(reference() + "/a_large_probs.tif")->readRegion({0, 0, 700, 500});
  EXPECT_EQ(cv::countNonZero(cv::Mat(with.reshape(1) != without.reshape(1))), 0);
  if (have("gdalinfo")) {
    auto info = run("gdalinfo " + out + "/a_large_labels.tif");
    EXPECT_NE(info.output.find("Overviews: 350x250, 175x125"), std::string::npos) << info.output;
    EXPECT_NE(info.output.find("Color Table"), std::string::npos) << info.output;
    EXPECT_NE(info.output.find("\"classes\":[\"glass\",\"blob\"]"), std::string::npos) << info.output;
  } else {
    std::cout << "gdal-bin missing: gdalinfo check skipped\n";
  }
  if (have("vipsheader")) {
    auto v = run("vipsheader -f n-pages " + out + "/a_large_probs.tif");
    EXPECT_EQ(v.output, "3\n") << v.output;
  } else {
    std::cout << "libvips-tools missing: vipsheader check skipped\n";
  }
  if (have("openslide-show-properties")) {
    auto o = run("openslide-show-properties " + out + "/a_large_labels.tif");
    EXPECT_NE(o.output.find("openslide.level-count: '3'"), std::string::npos) << o.output;
    EXPECT_NE(o.output.find("openslide.level[1].width: '350'"), std::string::npos) << o.output;
  } else {
    std::cout << "openslide-tools missing: openslide check skipped\n";
  }
}

// zstd's context is sized by its level alone (815 MB at 22): four compressing threads took 2.86 GB for a
// 300 px image. The pool is cut to what fits kCompressorBudgetBytes, and says so.
TEST_F(Pipeline, HighZstdLevelsCapTheCompressingThreadsToTheCodecBudget) {
  auto peak = [&](const std::string& name, const std::string& compression) {
    const std::string out = root_ + "/out_" + name;
    auto r =
        run(kTiler + " -i " + root_ + "/images/a_large.tif -m " + model_ + " -o " + out +
            " --window 128 --batch_size 4 --threads 1 --save labels,probs --no_progress --write_threads 4 "
            "--compression " +
            compression);
    EXPECT_EQ(r.code, 0) << r.output;
    return std::make_pair(report(out)["per_rank"][0]["peak_rss_mb"].get<double>(), r.output);
  };
  const auto [light, light_log] = peak("zstd1", "zstd:1");
  const auto [heavy, heavy_log] = peak("zstd22", "zstd:22");
  EXPECT_EQ(light_log.find("compressing threads"), std::string::npos) << light_log;
  EXPECT_NE(heavy_log.find("--compression zstd:22: 1 compressing threads instead of 4"), std::string::npos)
      << heavy_log;
  EXPECT_LT(heavy - light, double(kCompressorBudgetBytes >> 20) + 100) << light << " MB at zstd:1";
}

TEST_F(Pipeline, ABatchLargerThanTheJobIsCappedAtItsWindows) {
  // One window, --batch_size 100000: LibTorch was asked for 78 GB and printed a 24-frame backtrace.
  const std::string out = root_ + "/out_huge_batch";
  auto r = run(kTiler + " -i " + root_ + "/images/c_small.png -m " + model_ + " -o " + out +
               " --window 64 --batch_size 100000 --threads 1 --no_progress");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(report(out)["windows_total"], 1);
  EXPECT_TRUE(fs::exists(out + "/c_small_labels.tif"));
  // The default layout times a window's forward before the plan caps the batch: at a batch of 64 at most
  // (it asked for 100000 windows of 256 px, 78 GB). Thread counts past what can be busy are capped, said.
  r = run(kTiler + " -i " + root_ + "/images/c_small.png -m " + model_ + " -o " + out +
          " --window 256 --batch_size 100000 --read_threads 100000 --write_threads 100000 --no_progress " +
          "--overwrite");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("--read_threads 100000: capped at"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("--write_threads 100000: capped at"), std::string::npos) << r.output;
  EXPECT_LT(report(out)["read_threads"].get<int>(), 100000);
  EXPECT_LT(report(out)["per_rank"][0]["peak_rss_mb"].get<double>(), 2000.0);
}

}  // namespace
}  // namespace tiler::e2e
