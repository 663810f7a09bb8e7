// platform: files created anew (never through a planted link), atomic writes, the output directory's lock.
#include "tiler/core/platform.hpp"

#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
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

// Docs promise the lock file goes on exit: Ctrl-C (and ctrun's SIGTERM) left it behind, the default action
// ending the process before any destructor ran.
TEST(Platform, ASignalThatEndsTheHolderRemovesItsLockFile) {
  for (const int sig : {SIGINT, SIGTERM}) {
    const std::string dir = freshDir("signalled" + std::to_string(sig));
    int ready[2];
    ASSERT_EQ(pipe(ready), 0);
    const pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      DirectoryLock lock(dir);
      const char held = lock.locked() ? 'y' : 'n';
      if (write(ready[1], &held, 1) != 1) _exit(2);
      for (;;) pause();
    }
    close(ready[1]);
    char held = 0;
    ASSERT_EQ(read(ready[0], &held, 1), 1);
    close(ready[0]);
    EXPECT_EQ(held, 'y');
    EXPECT_TRUE(fs::exists(dir + "/.tiler.lock"));
    kill(child, sig);
    int status = 0;
    waitpid(child, &status, 0);
    EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == sig)
        << "ends by the signal, as before: " << status;
    EXPECT_FALSE(fs::exists(dir + "/.tiler.lock")) << strsignal(sig);
  }
}

// One file however it is named: through "..", through a linked directory, by a hard link, and by a symbolic
// link at the written name. Every clash names both paths and what each is.
TEST(Platform, PathRolesFindEveryNameOfAFileTheCommandUses) {
  const std::string dir = freshDir("roles");
  fs::create_directories(dir + "/v");
  std::ofstream(dir + "/v/x.png") << "image";
  std::ofstream(dir + "/v/m.pt") << "model";
  fs::create_directory_symlink(dir + "/v", dir + "/w");
  fs::create_hard_link(dir + "/v/x.png", dir + "/hard.png");
  fs::create_symlink(dir + "/v/m.pt", dir + "/model_link");
  PathRoles roles;
  roles.reads(dir + "/v/x.png", "the input");
  roles.reads(dir + "/v/m.pt", "the model");
  roles.writes(dir + "/o/x_labels.tif", "the labels output");  // o does not exist yet
  EXPECT_EQ(roles.claim(dir + "/v/x.png", "--report"),
            "--report '" + dir + "/v/x.png' is the input '" + dir +
                "/v/x.png', which this run reads: it never writes over it; choose another path");
  for (const std::string name : {"/v/../v/x.png", "/w/x.png", "/./v//x.png", "/hard.png"})
    EXPECT_NE(roles.claim(dir + name, "--report").find("is the input"), std::string::npos) << name;
  EXPECT_NE(roles.claim(dir + "/model_link", "--report").find("is the model"), std::string::npos);
  EXPECT_NE(roles.claim(dir + "/o/../o/x_labels.tif", "--report")
                .find("is the labels output '" + dir + "/o/x_labels.tif'"),
            std::string::npos);
  const std::string cwd = fs::current_path().string();
  fs::current_path(dir);
  EXPECT_NE(roles.claim("v/x.png", "--report").find("is the input"), std::string::npos) << "relative";
  fs::current_path(cwd);
  EXPECT_NE(roles.claim(dir + "/v", "--report").find("is a directory"), std::string::npos);
  // Claimed once, a name is taken; a character device may take output after output (our link to /dev/null:
  // a node of our own would need root).
  EXPECT_EQ(roles.claim(dir + "/report.json", "--report"), "");
  EXPECT_NE(roles.claim(dir + "/report.json", "-o").find("is --report '"), std::string::npos);
  fs::create_symlink("/dev/null", dir + "/null");
  EXPECT_EQ(roles.claim(dir + "/null", "-o"), "");
  EXPECT_EQ(roles.claim(dir + "/null", "--report"), "");
  // Entries a run makes and removes (checkpoints) hold nothing else it uses, whichever comes first.
  fs::create_directories(dir + "/ck/epoch-000003");
  std::ofstream(dir + "/ck/epoch-000003/model.pt") << "a checkpoint as the model";
  roles.reads(dir + "/ck/epoch-000003/model.pt", "the model");
  EXPECT_NE(roles.claimEntries(dir + "/ck", "epoch-", "the checkpoints").find("lies in the checkpoints"),
            std::string::npos);
  PathRoles later;
  EXPECT_EQ(later.claimEntries(dir + "/ck", "epoch-", "the checkpoints"), "");
  EXPECT_NE(later.claim(dir + "/ck/epoch-000009/out.pt", "-o").find("lies in the checkpoints"),
            std::string::npos);
  EXPECT_EQ(later.claim(dir + "/ck/final.pt", "-o"), "");
}

// `--report /dev/null` and a FIFO a program reads are written as they are, never unlinked or replaced; a FIFO
// nobody reads is an error at once, not a wait. Only nodes of the test's own are written (and /dev/null
// through a link of ours: a broken rule replaces the link, never the device).
TEST(Platform, AFifoOrCharacterDeviceIsWrittenAsSuchNeverReplaced) {
  const std::string dir = freshDir("streams");
  const std::string fifo = dir + "/fifo";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0644), 0);
  const int reader = open(fifo.c_str(), O_RDONLY | O_NONBLOCK);
  ASSERT_GE(reader, 0);
  EXPECT_EQ(writeFileAtomically(fifo, [](std::ostream& out) { out << "{\"report\": 1}\n"; }), "");
  char got[64] = {0};
  EXPECT_EQ(read(reader, got, sizeof got - 1), 14);
  EXPECT_STREQ(got, "{\"report\": 1}\n");
  close(reader);
  struct stat st {};
  ASSERT_EQ(lstat(fifo.c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode)) << "still the FIFO";
  EXPECT_FALSE(fs::exists(fifo + ".partial"));
  const auto t0 = std::chrono::steady_clock::now();
  const std::string unread = writeFileAtomically(fifo, [](std::ostream& out) { out << "{}"; });
  EXPECT_EQ(unread, "'" + fifo + "': cannot open: a FIFO that no process reads");
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0);
  ASSERT_EQ(lstat(fifo.c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));

  // A reader that leaves mid-write is a write error, not SIGPIPE ending the process.
  const int leaving = open(fifo.c_str(), O_RDONLY | O_NONBLOCK);
  ASSERT_GE(leaving, 0);
  std::thread leave([leaving] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    close(leaving);
  });
  const std::string cut =
      writeFileAtomically(fifo, [](std::ostream& out) { out << std::string(1 << 22, 'x'); });
  leave.join();
  EXPECT_EQ(cut.rfind("'" + fifo + "': cannot write: ", 0), 0u) << cut;

  fs::create_symlink("/dev/null", dir + "/null");
  EXPECT_EQ(writeFileAtomically(dir + "/null", [](std::ostream& out) { out << "{}"; }), "");
  EXPECT_TRUE(fs::is_symlink(dir + "/null")) << "written through, not replaced";
  ASSERT_EQ(stat("/dev/null", &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode));
  EXPECT_FALSE(fs::exists(dir + "/null.partial"));

  // A directory at the name is refused, as are sockets and block devices.
  fs::create_directories(dir + "/report.json");
  EXPECT_EQ(writeFileAtomically(dir + "/report.json", [](std::ostream& out) { out << "{}"; }),
            "'" + dir +
                "/report.json' is a directory; tiler writes files, character devices and FIFOs, never "
                "over anything else");

  // A character device node of our own (root only): written to, and at a temporary name left alone.
  const std::string node = dir + "/node";
  if (mknod(node.c_str(), S_IFCHR | 0666, makedev(1, 3)) != 0) GTEST_SKIP() << "mknod: " << strerror(errno);
  EXPECT_EQ(writeFileAtomically(node, [](std::ostream& out) { out << "{}"; }), "");
  ASSERT_EQ(lstat(node.c_str(), &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode));
  EXPECT_EQ(createFileExclusively(node), -1);
  EXPECT_EQ(errno, EEXIST);
  ASSERT_EQ(lstat(node.c_str(), &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode)) << "never unlinked";
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
