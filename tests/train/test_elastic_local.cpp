// Elastic training's pieces that need no MPI: the question to dtrainrun (its wire format, and an
// answer that never comes costing no more than the timeout), and one host's folder of commits
// (the {host} placeholder, a folder two hosts claim, the newest valid commit).
#include <doctest/doctest.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "dtrain/train/checkpoint_writer.hpp"
#include "dtrain/train/elastic_commits.hpp"
#include "dtrain/train/elastic_launcher.hpp"
#include "support/temp_dir.hpp"
#include "train/fake_launcher.hpp"

namespace {

using namespace dtrain::detail;
using elastic_test::FakeLauncher;
using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

LauncherClient client_of(const FakeLauncher& server, std::chrono::milliseconds timeout) {
  return LauncherClient({"127.0.0.1", static_cast<std::uint16_t>(server.port())}, timeout);
}

// A commit file of `step` holding one shared item, written as State writes it.
void write_commit(const fs::path& folder, std::int64_t step) {
  const int value = static_cast<int>(step);
  const dtrain::CheckpointItem items[] = {{"value", value}};
  dtrain::ObjectWriter w;
  write_payload_head(w, {.step = step, .epoch = 0}, 2, items);
  w.write(std::uint64_t{0});
  write_checkpoint_file(folder, step, 0, std::move(w.bytes()));
}

}  // namespace

TEST_CASE("elastic: DTRAIN_ELASTIC_NOTIFY is split at the last colon") {
  const auto plain = parse_notify_address("10.0.0.7:4567");
  REQUIRE(plain);
  CHECK(plain->host == "10.0.0.7");
  CHECK(plain->port == 4567);
  CHECK(parse_notify_address("a:b:7")->host == "a:b");
  for (const char* bad : {"", "10.0.0.7", ":80", "host:", "host:0", "host:65536", "host:8x"})
    CHECK_MESSAGE(!parse_notify_address(bad), bad);
}

TEST_CASE("elastic: the answer is GEN, the target generation and the next size") {
  const auto answer = parse_launcher_answer("GEN 3 4");
  REQUIRE(answer);
  CHECK(answer->target == 3);
  CHECK(answer->size == 4);
  CHECK(parse_launcher_answer("GEN 3 4\r"));
  for (const char* bad : {"", "GEN", "GEN 3", "GEN 3 4 5", "GEN -1 4", "ERR unknown request",
                          "gen 3 4", "GEN 3  4"})
    CHECK_MESSAGE(!parse_launcher_answer(bad), bad);
}

TEST_CASE("elastic: one request, one answer") {
  FakeLauncher server("GEN 5 2\n");
  auto client = client_of(server, std::chrono::milliseconds(2000));
  const auto first = client.ask();
  REQUIRE_MESSAGE(first.answer, first.problem);
  CHECK(first.answer->target == 5);
  CHECK(first.answer->size == 2);
  server.set(FakeLauncher::Mode::answer, "GEN 6 3\n");
  CHECK(client.ask().answer->target == 6);
  CHECK(server.requests() == 2);
}

TEST_CASE("elastic: a launcher that says nothing usable is a missing answer, within the timeout") {
  FakeLauncher server;
  const auto timeout = std::chrono::milliseconds(300);
  auto client = client_of(server, timeout);

  server.set(FakeLauncher::Mode::garbage);
  auto outcome = client.ask();
  CHECK(!outcome.answer);
  CHECK(outcome.problem.find("'HELLO'") != std::string::npos);

  server.set(FakeLauncher::Mode::close);
  outcome = client.ask();
  CHECK(!outcome.answer);
  CHECK(outcome.problem.find("closed without an answer") != std::string::npos);

  server.set(FakeLauncher::Mode::silent);
  const auto start = Clock::now();
  outcome = client.ask();
  const auto took = Clock::now() - start;
  CHECK(!outcome.answer);
  CHECK(outcome.problem == "no answer in time");
  CHECK(took >= timeout);
  CHECK(took < timeout + std::chrono::milliseconds(700));
}

TEST_CASE("elastic: nobody listening is a missing answer at once") {
  std::uint16_t port = 0;
  {
    FakeLauncher gone;  // a port that was just free, and is closed again
    port = static_cast<std::uint16_t>(gone.port());
  }
  LauncherClient client({"127.0.0.1", port}, std::chrono::milliseconds(2000));
  const auto start = Clock::now();
  const auto outcome = client.ask();
  CHECK(!outcome.answer);
  CHECK(outcome.problem.find("connect") != std::string::npos);
  CHECK(Clock::now() - start < std::chrono::milliseconds(1000));

  LauncherClient nowhere({"no-such-host.invalid", 80}, std::chrono::milliseconds(500));
  CHECK(nowhere.ask().problem.find("cannot resolve 'no-such-host.invalid'") != std::string::npos);
}

TEST_CASE("elastic: {host} in the folder becomes the host's name, as one path component") {
  CHECK(resolve_commit_directory("/local/{host}/job", "node7") == fs::path("/local/node7/job"));
  CHECK(resolve_commit_directory("/c/{host}-{host}", "a/b c") == fs::path("/c/a_b_c-a_b_c"));
  CHECK(resolve_commit_directory("/dev/shm/job", "node7") == fs::path("/dev/shm/job"));
  CHECK(resolve_commit_directory("/c/{host}", "..") == fs::path("/c/_.."));
}

TEST_CASE("elastic: a commit folder belongs to one host") {
  dtrain::test::TempDir dir("dtrain-elastic-test-");
  const fs::path folder = dir / "commits";
  CHECK(claim_commit_directory(folder, "node1") == "");
  CHECK(fs::exists(folder / ".dtrain-host-node1"));
  CHECK(claim_commit_directory(folder, "node1") == "");  // the same host again: a later world
  const std::string refused = claim_commit_directory(folder, "node2");
  CHECK(refused.find("belongs to host node1 as well as to this host (node2)") != std::string::npos);
  CHECK(refused.find("{host}") != std::string::npos);
}

TEST_CASE("elastic: the newest valid commit of a folder; a damaged one is set aside") {
  dtrain::test::TempDir dir("dtrain-elastic-test-");
  const fs::path folder = dir.path();
  std::vector<char> bytes;
  CheckpointRecord record;
  CHECK(!newest_valid_commit(folder, bytes, record));

  write_commit(folder, 5);
  write_commit(folder, 10);
  {  // flip a byte of step 10's payload
    std::fstream f(folder / checkpoint_file_name(10),
                   std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(checkpoint_header_bytes + 3));
    f.put('\x7f');
  }
  const auto newest = newest_valid_commit(folder, bytes, record);
  REQUIRE(newest);
  CHECK(*newest == 5);
  CHECK(record.step == 5);
  CHECK(record.world_size == 2);
  CHECK(fs::exists(folder / (checkpoint_file_name(10) + ".invalid")));
  CHECK(!fs::exists(folder / checkpoint_file_name(10)));
}
