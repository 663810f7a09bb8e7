// End-to-end tests of `tiler infer` on several ranks: world sizes 1-4 and gloo's sockets, rows dealt
// between ranks, and every launcher: ctrun (one node and two), Slurm's and Open MPI's variables, mpirun,
// PyTorch's torchrun (static and c10d rendezvous, a killed rank), a rendezvous that times out.
#include "pipeline_util.hpp"

#include <unistd.h>

#include <map>

#include "tiler/core/error.hpp"

namespace tiler::e2e {
namespace {

TEST_F(Pipeline, WorldSizesOneToFourAreByteIdentical) {
  const std::string ref = reference();
  for (int n = 1; n <= 4; ++n) {
    const std::string out = root_ + "/out_w" + std::to_string(n);
    runCtrun(n, out);
    expectSameOutputs(ref, out);
    EXPECT_EQ(report(out)["world_size"], n);
    EXPECT_EQ(report(out)["gather"], n == 1 ? "none" : "shared_memory") << "ranks of one host";
    // Every rank writes the images it owns: together all of them, and every byte of the outputs.
    int64_t owned = 0, bytes = 0, files = 0;
    const nlohmann::json j = report(out);  // alive while the loop reads it
    for (const auto& r : j["per_rank"]) {
      owned += r["images_owned"].get<int64_t>();
      bytes += r["bytes_written"].get<int64_t>();
      EXPECT_GT(r["bytes_written"].get<int64_t>(), 0) << "rank " << r["rank"] << " of " << n;
    }
    for (const auto& e : fs::directory_iterator(out))
      if (e.path().extension() == ".tif") files += int64_t(fs::file_size(e.path()));
    EXPECT_EQ(owned, 5);
    EXPECT_EQ(bytes, files);
  }
  // Through gloo's sockets, the same bytes.
  const std::string out = root_ + "/out_w3_sockets";
  runCtrun(3, out, "--no_shared_memory");
  expectSameOutputs(ref, out);
  EXPECT_EQ(report(out)["gather"], "gloo");
}

TEST_F(Pipeline, RendezvousTimeoutIsAClearDistError) {
  const int port = freePort();
  auto r = run("RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(port) +
               " " + tilerArgs(root_ + "/out_timeout", "--timeout 2"));
  EXPECT_EQ(r.code, 1);
  EXPECT_LT(r.seconds, 60) << "the 2 s --timeout, not the default 300 s, ended the wait";
  EXPECT_NE(r.output.find("127.0.0.1:" + std::to_string(port)), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("rank 1"), std::string::npos) << r.output;
}

void runTwoWithEnv(const std::string& rank_var, const std::string& size_var, const std::string& cmd) {
  const std::string port = std::to_string(freePort());
  std::vector<std::string> commands;
  for (int r = 0; r < 2; ++r)
    commands.push_back(rank_var + "=" + std::to_string(r) + " " + size_var +
                       "=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=" + port + " " + cmd);
  for (int code : test::runConcurrently(commands)) EXPECT_EQ(code, 0) << rank_var << " run failed";
}

TEST_F(Pipeline, RunsUnderSlurmAndOpenMpiVariables) {
  const std::string slurm = root_ + "/out_slurm";
  runTwoWithEnv("SLURM_PROCID", "SLURM_NTASKS", "SLURM_STEP_ID=0 " + tilerArgs(slurm));  // srun's step
  expectSameOutputs(reference(), slurm);
  EXPECT_EQ(report(slurm)["world_size"], 2);
  const std::string mpi = root_ + "/out_mpi";
  runTwoWithEnv("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", tilerArgs(mpi));
  expectSameOutputs(reference(), mpi);
}

TEST_F(Pipeline, TwoCtrunNodesOnLoopbackFormOneWorld) {
  const std::string out = root_ + "/out_nodes";
  const std::string port = std::to_string(freePort());
  std::vector<std::string> commands;
  for (int node = 0; node < 2; ++node)
    commands.push_back(kCtrun + " --nnodes 2 --node_rank " + std::to_string(node) +
                       " --nproc_per_node 2 --master_port " + port + " " + tilerArgs(out));
  for (int code : test::runConcurrently(commands)) EXPECT_EQ(code, 0);
  EXPECT_EQ(report(out)["world_size"], 4);
  expectSameOutputs(reference(), out);
}

// The file rendezvous hands tiler's ranks node 0's host name as MASTER_ADDR (torch elastic's choice too)
// where it resolves, else an address of one of its interfaces. Where a UTS namespace can be had, the nodes
// run under a host name no resolver knows (a container's), which must not leave the ranks waiting.
TEST_F(Pipeline, TwoCtrunNodesMeetingInADirectoryWriteTheBytesOfOneProcess) {
  const std::string out = root_ + "/out_file_nodes";
  const bool unresolvable = run("unshare --uts sh -c 'hostname tiler-nowhere.invalid' 2>/dev/null").code == 0;
  const std::string launch =
      unresolvable ? "unshare --uts sh -c 'hostname tiler-nowhere.invalid && exec \"$@\"' sh " + kCtrun
                   : kCtrun;
  const std::string args =
      " --nnodes 2 --nproc_per_node 2 --rdzv_backend file --rdzv_timeout 60 --rdzv_endpoint " + root_ +
      "/meeting --rdzv_id e2e_file " + tilerArgs(out);
  for (int code : test::runConcurrently({launch + args, launch + args})) EXPECT_EQ(code, 0);
  EXPECT_EQ(report(out)["world_size"], 4);
  expectSameOutputs(reference(), out);
}

// PyTorch's own torchrun (python3-torch), or "" when it is missing. Debian's 1.13 under Python 3.11 cannot
// parse its own defaults of -r and -t ("0": IntFlag no longer iterates its zero member), so both are given as
// a value it parses (2: each worker's stderr in a log file and on the console). --monitor_interval 0.2: its
// checks 5 times a second, not every 5 s.
// Why PyTorch's torchrun cannot run here, or "": python3-torch missing, or a TCPStore that cannot start with
// its defaults (Debian trixie's 2.6 is built without libuv yet asks for it, and torchrun's static rendezvous
// passes no use_libuv: torchrun itself fails).
std::string torchrunUnusable() {
  if (run("/usr/bin/python3 -c 'import torch.distributed.run' 2>/dev/null").code != 0)
    return "python3-torch is missing";
  if (run("/usr/bin/python3 -c 'import torch.distributed as d; d.TCPStore(\"127.0.0.1\", " +
          std::to_string(freePort()) + ", 1, True)' 2>/dev/null")
          .code != 0)
    return "this PyTorch's TCPStore cannot start with its defaults (built without libuv, which it asks for)";
  return "";
}

std::string torchrun(int nproc = 2) {
  if (!torchrunUnusable().empty()) return "";
  // USE_LIBUV=0: Debian trixie's python3-torch 2.6 is built without libuv, yet its TCPStore asks for it
  // unless told not to (torch 2.4+ reads the variable; 1.13 ignores it).
  return "USE_LIBUV=0 /usr/bin/python3 -m torch.distributed.run -r 2 -t 2 --monitor_interval 0.2 "
         "--nproc_per_node " +
         std::to_string(nproc) + " ";
}

// Static (torchrun's default: its agent serves the c10d store on --master_port and every worker reaches it as
// a client under /worker/attempt_0) and c10d (the workers' rank 0 hosts it): the bytes of one process.
TEST_F(Pipeline, TorchrunsStaticAndC10dRendezvousWriteTheBytesOfOneProcess) {
  const std::string launcher = torchrun();
  if (launcher.empty()) GTEST_SKIP() << torchrunUnusable() << ": tiler was not run under PyTorch's torchrun";
  const std::string ref = reference();
  const std::string static_out = root_ + "/out_torchrun_static";
  auto r = run(launcher + "--rdzv_backend static --master_addr 127.0.0.1 --master_port " +
               std::to_string(freePort()) + " --no_python " + tilerArgs(static_out));
  ASSERT_EQ(r.code, 0) << r.output;
  expectSameOutputs(ref, static_out);
  EXPECT_EQ(report(static_out)["world_size"], 2);
  const std::string c10d_out = root_ + "/out_torchrun_c10d";
  r = run(launcher + "--rdzv_backend c10d --rdzv_endpoint 127.0.0.1:" + std::to_string(freePort()) +
          " --rdzv_id e2e --no_python " + tilerArgs(c10d_out));
  ASSERT_EQ(r.code, 0) << r.output;
  expectSameOutputs(ref, c10d_out);
}

// Rank 2 of 3 crashes; ranks 0 and 1 find its connection closed, name it (the rank of this host whose process
// is gone) and wait for torchrun to stop them rather than exit first: torchrun, which stamps a worker without
// an error file when its check finds it dead, names rank 2 alone.
TEST_F(Pipeline, TorchrunNamesAKilledRankAsTheRootCause) {
  const std::string launcher = torchrun(3);
  if (launcher.empty()) GTEST_SKIP() << torchrunUnusable() << ": tiler was not run under PyTorch's torchrun";
  auto r = run("TILER_FAULT=rank:2,after_windows:4,kind:crash " + launcher + "--master_addr 127.0.0.1 " +
               "--master_port " + std::to_string(freePort()) + " --no_python " +
               tilerArgs(root_ + "/out_torchrun_killed"));
  EXPECT_NE(r.code, 0);
  EXPECT_LT(r.seconds, 30) << "the job ended at torchrun's check, not at a timeout";
  const auto root = r.output.find("Root Cause (first observed failure):");
  ASSERT_NE(root, std::string::npos) << r.output;
  EXPECT_NE(r.output.find("rank      : 2 (local_rank: 2)", root), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("Signal 11 (SIGSEGV)", root), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("<NO_OTHER_FAILURES>"), std::string::npos) << "no follow-on listed: " << r.output;
  // A survivor that noticed before torchrun stopped it names the vanished rank (on a loaded machine
  // torchrun's check may stop them first: ASurvivorNamesItsVanishedPeer tests the message without a
  // launcher).
  if (r.output.find("[default0]:tiler: error") != std::string::npos ||
      r.output.find("[default1]:tiler: error") != std::string::npos) {
    EXPECT_NE(r.output.find("rank 2's connection closed (it exited or was killed)"), std::string::npos)
        << r.output;
  }
  EXPECT_EQ(r.output.find("failed after waiting"), std::string::npos) << "not a timeout: " << r.output;
}

// Rank 1 of 2 crashes with no launcher to stop rank 0 (srun's environment): the survivor says its peer's
// connection closed, at once, not that it waited up to --timeout.
TEST_F(Pipeline, ASurvivorNamesItsVanishedPeer) {
  const std::string out = root_ + "/out_vanished", port = std::to_string(freePort());
  std::vector<std::string> commands;
  for (int r = 0; r < 2; ++r)
    // A shell of its own keeps its output (runConcurrently sends the outer one's to /dev/null).
    commands.push_back("sh -c 'TILER_FAULT=rank:1,after_windows:4,kind:crash SLURM_STEP_ID=0 SLURM_PROCID=" +
                       std::to_string(r) + " SLURM_NTASKS=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=" + port + " " +
                       tilerArgs(out, "--timeout 300") + " > " + root_ + "/vanished_" + std::to_string(r) +
                       ".log 2>&1'");
  const auto t0 = Clock::now();
  const auto codes = test::runConcurrently(commands);
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 60) << "well before --timeout 300";
  EXPECT_EQ(codes[0], 1);
  EXPECT_NE(codes[1], 0);
  const std::string survivor = test::slurp(root_ + "/vanished_0.log");
  EXPECT_NE(survivor.find("rank 1's connection closed (it exited or was killed)"), std::string::npos)
      << survivor;
  EXPECT_EQ(survivor.find("failed after waiting"), std::string::npos) << survivor;
}

// Open MPI's mpirun (openmpi-bin): its ranks read OMPI_COMM_WORLD_*; MASTER_ADDR/PORT passed with -x.
TEST_F(Pipeline, MpirunsTwoRanksWriteTheBytesOfOneProcess) {
  if (run("command -v mpirun").code != 0)
    GTEST_SKIP() << "mpirun is missing (openmpi-bin: scripts/setup-deps.sh)";
  const std::string out = root_ + "/out_mpirun";
  auto r = run(std::string("mpirun --oversubscribe ") + (getuid() == 0 ? "--allow-run-as-root " : "") +
               "-np 2 -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=" + std::to_string(freePort()) + " " +
               tilerArgs(out));
  ASSERT_EQ(r.code, 0) << r.output;
  expectSameOutputs(reference(), out);
  EXPECT_EQ(report(out)["world_size"], 2);
}

// `tiler` on a line of an sbatch script: the script runs once, as task 0 of the job's 8, in no srun step.
TEST_F(Pipeline, PlainTilerInAnSbatchScriptOfSeveralTasksSaysToRunItWithSrun) {
  const std::string out = root_ + "/out_sbatch";
  auto r =
      run("env -u SLURM_STEP_ID -u SLURM_STEPID SLURM_JOB_ID=7 SLURM_PROCID=0 SLURM_NTASKS=8 "
          "SLURM_TASKS_PER_NODE='4(x2)' SLURM_NODEID=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 " +
          tilerArgs(out));
  EXPECT_EQ(r.code, kExitFatal) << r.output;
  EXPECT_LT(r.seconds, 10) << "at once, not after --timeout";
  EXPECT_NE(r.output.find("SLURM_NTASKS=8 but this process is no task of an srun step"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("run it with srun"), std::string::npos) << r.output;
}

// Two ranks take a part of every row of windows each (rank 0 holds the other part's early predictions) and
// decode the input tiles their parts share only where the parts meet: a 1024 px image of 64 px tiles, 11 rows
// of 11 windows. With --shard_buffer 0 rows are cut into pieces of one batch a rank, whose parts meet more
// often.
TEST_F(Pipeline, RanksTakePartsOfRowsDecodeSharedTilesOnceAndWriteTheSameBytes) {
  const std::string dir = root_ + "/runs";
  fs::create_directories(dir + "/in");
  WriterOptions wo;
  wo.tile = 64;
  ImageWriter w(dir + "/in/tiles.tif", 1024, 1024, 3, SampleType::kU8, wo);
  w.writeRows(pattern(1024, 1024, CV_8UC3, 255));
  w.close();
  const std::string args = kTiler + " -i " + dir + "/in -m " + model_ +
                           " --window 128 --batch_size 4 --threads 1 --save labels,probs --no_progress";
  auto tiles = [&](const std::string& out) {
    int64_t sum = 0;
    const nlohmann::json j = report(out);  // held: a loop over a temporary's member would dangle
    for (const auto& r : j["per_rank"]) sum += r["tiles_decoded"].get<int64_t>();
    return sum;
  };
  auto one = run(args + " -o " + dir + "/one");
  ASSERT_EQ(one.code, 0) << one.output;
  EXPECT_EQ(tiles(dir + "/one"), 256) << "one rank decodes every tile once";
  EXPECT_EQ(report(dir + "/one")["shard_run"], 121) << "one rank: every window in a row";
  const std::string two_ranks = kCtrun + " --nproc_per_node 2 --master_port 0 " + args;
  std::map<std::string, int64_t> decoded;
  for (const char* buffer : {"", "--shard_buffer 0"}) {
    const std::string out = dir + (*buffer ? "/two_pieces" : "/two");
    auto two = run(two_ranks + " -o " + out + " " + buffer);
    ASSERT_EQ(two.code, 0) << two.output;
    for (const char* kind : {"labels", "probs"}) {
      const std::string name = std::string("/tiles_") + kind + ".tif";
      EXPECT_TRUE(slurp(dir + "/one" + name) == slurp(out + name)) << out << name;
    }
    decoded[buffer] = tiles(out);
    // Rows of 11 are stacked (11 x 11 is under the default's pieces), halves of the image; with pieces of
    // one batch a rank they are split, in pieces of 5 and 6.
    EXPECT_EQ(report(out)["shard_run"], *buffer ? 3 : 61) << out;
  }
  // Runs of one batch a rank and step (before rows were dealt) decoded more than 384.
  EXPECT_LE(decoded[""], 256 * 5 / 4) << "parts of rows: only the tiles where the parts meet twice";
  EXPECT_GT(decoded["--shard_buffer 0"], decoded[""]) << "pieces of a batch a rank meet more often";

  // A narrow image, 21 rows of one window: rows split between the ranks would alternate, and both ranks
  // would decode nearly every tile; stacked, they meet once.
  fs::create_directories(dir + "/narrow");
  ImageWriter narrow(dir + "/narrow/strip.tif", 128, 2048, 3, SampleType::kU8, wo);
  narrow.writeRows(pattern(2048, 128, CV_8UC3, 255));
  narrow.close();
  const std::string strip = kTiler + " -i " + dir + "/narrow -m " + model_ +
                            " --window 128 --batch_size 4 --threads 1 --save labels --no_progress";
  auto strip_one = run(strip + " -o " + dir + "/strip_one");
  ASSERT_EQ(strip_one.code, 0) << strip_one.output;
  EXPECT_EQ(tiles(dir + "/strip_one"), 64);
  auto strip_two = run(kCtrun + " --nproc_per_node 2 --master_port 0 " + strip + " -o " + dir + "/strip_two");
  ASSERT_EQ(strip_two.code, 0) << strip_two.output;
  EXPECT_TRUE(slurp(dir + "/strip_one/strip_labels.tif") == slurp(dir + "/strip_two/strip_labels.tif"));
  EXPECT_LE(tiles(dir + "/strip_two"), 64 * 5 / 4) << "stacked rows: the ranks meet once";
}

}  // namespace
}  // namespace tiler::e2e
