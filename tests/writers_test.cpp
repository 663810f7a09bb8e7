// writers: the one commit protocol every output goes through (commitWriters), and the format units' text.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "test_util.hpp"
#include "tiler/core/error.hpp"
#include "tiler/core/platform.hpp"
#include "tiler/writers/coco.hpp"
#include "tiler/writers/csv.hpp"
#include "tiler/writers/output_file.hpp"

namespace fs = std::filesystem;
using namespace tiler;

namespace {

// A writer whose finish or commit fails on demand, around a text file.
class FailingWriter : public OutputWriter {
 public:
  FailingWriter(const std::string& path, bool fail_finish, bool fail_commit)
      : file_(path), fail_finish_(fail_finish), fail_commit_(fail_commit) {
    file_.write("some rows\n");
  }
  void finish() override {
    TILER_CHECK(!fail_finish_, IoError, "'" << file_.partial() << "': disk full");
    file_.finish();
  }
  void commit(std::vector<std::string>& renamed) override {
    TILER_CHECK(!fail_commit_, IoError, "'" << file_.path() << "': rename failed");
    file_.commit(renamed);
  }

 private:
  TextFile file_;
  bool fail_finish_, fail_commit_;
};

}  // namespace

TEST(Writers, CommitRenamesEveryFinishedWriter) {
  const std::string dir = test::scratchDir("writers_commit");
  FailingWriter a(dir + "/a.csv", false, false), b(dir + "/b.csv", false, false);
  const auto paths = commitWriters({&a, nullptr, &b});
  EXPECT_EQ(paths, (std::vector<std::string>{dir + "/a.csv", dir + "/b.csv"}));
  EXPECT_EQ(test::slurp(dir + "/b.csv"), "some rows\n");
  EXPECT_FALSE(fs::exists(dir + "/a.csv.partial"));
  removeTree(dir);
}

// A writer that cannot finish: nothing is renamed, and every partial file goes with its writer.
TEST(Writers, AFailedFinishRenamesNone) {
  const std::string dir = test::scratchDir("writers_finish");
  {
    FailingWriter a(dir + "/a.csv", false, false), b(dir + "/b.csv", true, false);
    EXPECT_THROW(commitWriters({&a, &b}), IoError);
    EXPECT_FALSE(fs::exists(dir + "/a.csv"));
    EXPECT_FALSE(fs::exists(dir + "/b.csv"));
  }
  EXPECT_TRUE(fs::is_empty(dir));
  removeTree(dir);
}

// A rename that fails takes back those already renamed: no set of outputs is ever half there.
TEST(Writers, AFailedRenameTakesBackTheRenamed) {
  const std::string dir = test::scratchDir("writers_rename");
  {
    FailingWriter a(dir + "/a.csv", false, false), b(dir + "/b.csv", false, true);
    EXPECT_THROW(commitWriters({&a, &b}), IoError);
    EXPECT_FALSE(fs::exists(dir + "/a.csv"));
  }
  EXPECT_TRUE(fs::is_empty(dir));
  removeTree(dir);
}

TEST(Writers, CsvQuotesItsHeaderAndKeepsRowsAsGiven) {
  const std::string dir = test::scratchDir("writers_csv");
  CsvFile csv(dir + "/t.csv", {"id", "prob_a,b", "say \"hi\""});
  csv.row("1,0.5,x");
  std::vector<std::string> renamed;
  csv.finish();
  csv.commit(renamed);
  EXPECT_EQ(test::slurp(dir + "/t.csv"), "id,\"prob_a,b\",\"say \"\"hi\"\"\"\n1,0.5,x\n");
  removeTree(dir);
}

// COCO's categories are those its boxes named, by id, whatever order they came in.
TEST(Writers, CocoListsTheCategoriesSeenInIdOrder) {
  const std::string dir = test::scratchDir("writers_coco");
  CocoFile coco(dir + "/c.json", "d", "s.tif", 10, 20);
  coco.add(1, 3, "tumour", 0, 0, 2, 2, 0.5f);
  coco.add(2, 1, "stroma", 1, 1, 4, 5, 0.25f);
  std::vector<std::string> renamed;
  coco.finish();
  coco.commit(renamed);
  const std::string text = test::slurp(dir + "/c.json");
  EXPECT_NE(text.find("\"categories\": [{\"id\": 1, \"name\": \"stroma\", \"supercategory\": \"object\"}, "
                      "{\"id\": 3, \"name\": \"tumour\""),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("\"bbox\": [1,1,3,4], \"area\": 12"), std::string::npos) << text;
  removeTree(dir);
}
