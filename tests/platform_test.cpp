// platform: files created anew (never through a planted link), atomic writes, the output directory's lock.
#include "tiler/platform.hpp"

#include <gtest/gtest.h>

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <chrono>
#include <thread>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "test_util.hpp"

namespace tiler {
namespace {

namespace fs = std::filesystem;

std::string freshDir(const std::string& name) {
  const fs::path dir =
      fs::temp_directory_path() / ("tiler_platform_" + name + "_" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(Platform, APlantedLinkIsReplacedNeverFollowed) {
  const std::string dir = freshDir("link");
  const std::string victim = dir + "/victim.txt", tmp = dir + "/out.partial";
  std::ofstream(victim) << "precious";
  fs::create_symlink(victim, tmp);
  const int fd = createFileExclusively(tmp);
  ASSERT_GE(fd, 0) << std::strerror(errno);
  ASSERT_EQ(write(fd, "new", 3), 3);
  close(fd);
  EXPECT_EQ(slurp(victim), "precious");
  EXPECT_FALSE(fs::is_symlink(tmp));
  EXPECT_EQ(slurp(tmp), "new");
}

TEST(Platform, AtomicWritesGoThroughAFreshPartialFile) {
  const std::string dir = freshDir("atomic");
  const std::string victim = dir + "/victim.txt", path = dir + "/report.json";
  std::ofstream(victim) << "precious";
  // The report's temporary name, planted as a link to a file the user can write: std::ofstream followed it.
  fs::create_symlink(victim, path + ".partial");
  EXPECT_EQ(writeFileAtomically(path, [](std::ostream& out) { out << "{}"; }), "");
  EXPECT_EQ(slurp(victim), "precious");
  EXPECT_EQ(slurp(path), "{}");
  EXPECT_FALSE(fs::exists(path + ".partial"));
  // A writer that throws leaves the old file whole and no partial file behind.
  const std::string error = writeFileAtomically(path, [](std::ostream& out) {
    out << "half";
    throw std::runtime_error("boom\nmore");
  });
  EXPECT_NE(error.find("boom"), std::string::npos) << error;
  EXPECT_EQ(error.find("more"), std::string::npos) << "one line: " << error;
  EXPECT_EQ(slurp(path), "{}");
  EXPECT_FALSE(fs::exists(path + ".partial"));
  EXPECT_NE(writeFileAtomically(dir + "/no/such/dir/r.json", [](std::ostream&) {}), "");
}

TEST(Platform, ReadWholeFileReadsEveryByteOrNothing) {
  const std::string dir = freshDir("read_whole");
  const std::string bytes("a\0b\n\xff", 5);
  std::ofstream(dir + "/f", std::ios::binary) << bytes;
  EXPECT_EQ(readWholeFile(dir + "/f"), bytes);
  EXPECT_EQ(readWholeFile(dir + "/missing"), "");
  EXPECT_EQ(readWholeFile(dir), "") << "a directory";
  EXPECT_NE(readWholeFile("/proc/self/stat").find(')'), std::string::npos) << "a /proc file (size 0 in stat)";
  removeTree(dir);
}

TEST(Platform, OnlyAPlainFileCountsAsDone) {
  const std::string dir = freshDir("plain");
  std::ofstream(dir + "/a.tif") << "x";
  fs::create_symlink(dir + "/a.tif", dir + "/link.tif");
  fs::create_symlink(dir + "/missing.tif", dir + "/dangling.tif");
  EXPECT_TRUE(isPlainFile(dir + "/a.tif"));
  EXPECT_FALSE(isPlainFile(dir + "/link.tif"));
  EXPECT_FALSE(isPlainFile(dir + "/dangling.tif"));
  EXPECT_FALSE(isPlainFile(dir + "/missing.tif"));
  EXPECT_FALSE(isPlainFile(dir));
}

TEST(Platform, ADirectoryIsLockedByOneHolderAtATime) {
  const std::string dir = freshDir("lock");
  {
    DirectoryLock first(dir);
    ASSERT_TRUE(first.locked()) << first.error();
    EXPECT_EQ(slurp(dir + "/.tiler.lock"), std::to_string(getpid()) + "\n");
    DirectoryLock second(dir);
    EXPECT_FALSE(second.locked());
    EXPECT_NE(second.error().find("pid " + std::to_string(getpid())), std::string::npos) << second.error();
  }
  EXPECT_FALSE(fs::exists(dir + "/.tiler.lock")) << "released and removed";
  DirectoryLock again(dir);
  EXPECT_TRUE(again.locked()) << again.error();
}

TEST(Platform, AHolderThatDiesReleasesTheLock) {
  const std::string dir = freshDir("died");
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    DirectoryLock lock(dir);
    _exit(lock.locked() ? 0 : 1);  // no destructor: the file stays, as after a crash
  }
  int status = 0;
  waitpid(child, &status, 0);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_TRUE(fs::exists(dir + "/.tiler.lock"));
  DirectoryLock lock(dir);
  EXPECT_TRUE(lock.locked()) << lock.error();
}

TEST(Platform, ALockFileThatIsALinkIsRefused) {
  const std::string dir = freshDir("locklink");
  std::ofstream(dir + "/victim") << "precious";
  fs::create_symlink(dir + "/victim", dir + "/.tiler.lock");
  DirectoryLock lock(dir);
  EXPECT_FALSE(lock.locked());
  EXPECT_NE(lock.error().find(".tiler.lock"), std::string::npos) << lock.error();
  EXPECT_EQ(slurp(dir + "/victim"), "precious");
}

TEST(Platform, RemoveTreeRemovesContentsAndLinksButNotWhatTheyPointTo) {
  const std::string root = test::scratchDir("remove_tree");
  const std::string keep = root + "/keep", tree = root + "/tree";
  fs::create_directories(keep);
  std::ofstream(keep + "/precious") << "x";
  fs::create_directories(tree + "/a/b/c");
  std::ofstream(tree + "/a/b/c/file") << "y";
  std::ofstream(tree + "/top") << "z";
  fs::create_directory_symlink(keep, tree + "/a/link");
  EXPECT_TRUE(removeTree(tree));
  EXPECT_FALSE(fs::exists(tree));
  EXPECT_TRUE(fs::exists(keep + "/precious")) << "a link is removed, not followed";
  EXPECT_TRUE(removeTree(tree)) << "a missing path counts as removed";
  std::ofstream(root + "/plain") << "w";
  EXPECT_TRUE(removeTree(root + "/plain"));
  EXPECT_FALSE(fs::exists(root + "/plain"));
}

TEST(Platform, ReadsTheTightestCgroupCpuQuota) {
  const fs::path root = test::scratchDir("cgroups");
  const auto writeFile = [](const fs::path& file, const std::string& text) {
    fs::create_directories(file.parent_path());
    std::ofstream(file) << text;
  };
  // cgroup v2: the job's cgroup is unlimited, its parent 1.5 CPUs (rounded up), the root 4.
  writeFile(root / "v2/job.slice/step/cpu.max", "max 100000\n");
  writeFile(root / "v2/job.slice/cpu.max", "150000 100000\n");
  writeFile(root / "v2/cpu.max", "400000 100000\n");
  EXPECT_EQ(cgroupCpuQuota("0::/job.slice/step\n", (root / "v2").string()), 2);
  EXPECT_EQ(cgroupCpuQuota("0::/\n", (root / "v2").string()), 4);
  writeFile(root / "open/cpu.max", "max 100000\n");
  EXPECT_EQ(cgroupCpuQuota("0::/\n", (root / "open").string()), 0) << "no quota";
  // cgroup v1 with cpu and cpuacct mounted together; other controllers' lines are ignored.
  const std::string v1 = "5:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n0::/\n";
  writeFile(root / "v1/cpu,cpuacct/docker/abc/cpu.cfs_quota_us", "300000\n");
  writeFile(root / "v1/cpu,cpuacct/docker/abc/cpu.cfs_period_us", "100000\n");
  EXPECT_EQ(cgroupCpuQuota(v1, (root / "v1").string()), 3);
  // Inside a container the cgroup's path does not exist under the mount, whose root is the container's own.
  writeFile(root / "ns/cpu,cpuacct/cpu.cfs_quota_us", "50000\n");
  writeFile(root / "ns/cpu,cpuacct/cpu.cfs_period_us", "100000\n");
  EXPECT_EQ(cgroupCpuQuota(v1, (root / "ns").string()), 1) << "half a CPU is one";
  writeFile(root / "none/cpu,cpuacct/cpu.cfs_quota_us", "-1\n");
  writeFile(root / "none/cpu,cpuacct/cpu.cfs_period_us", "100000\n");
  EXPECT_EQ(cgroupCpuQuota(v1, (root / "none").string()), 0);
  EXPECT_EQ(cgroupCpuQuota(v1, (root / "missing").string()), 0);
  EXPECT_EQ(cgroupCpuQuota("", root.string()), 0);
  removeTree(root.string());
}

// The process's age from the kernel's start time: it grows with the wall clock, at 10 ms resolution.
TEST(Platform, SecondsSinceProcessStartFollowTheClock) {
  const double before = secondsSinceProcessStart();
  ASSERT_GE(before, 0.0);
  EXPECT_LT(before, 3600.0) << "a test process is young";
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const double after = secondsSinceProcessStart();
  EXPECT_NEAR(after - before, 0.2, 0.05);
}

}  // namespace
}  // namespace tiler
