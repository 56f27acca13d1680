#pragma once
// Flags with which the test suite injects faults into a trainer and watches what it does: a rank
// that kills itself after a step (restarts), and in elastic mode each step's samples written to a
// file, a commit and exit at a step as for a resize, and a pause after each step. They are
// declared here, apart from the trainer's own flags and out of its --help, and the trainer calls
// into TestingHooks where they act.

#include <CLI/CLI.hpp>

#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>

#include "cli.hpp"

namespace examples {

struct TestingHooks {
  // --crash-rank R --crash-after-step N: rank R kills itself with SIGKILL after step N, once the
  // checkpoints before it are on disk; a run that resumed does not crash again.
  int crash_rank = -1;
  std::int64_t crash_after_step = 0;
  // Elastic mode. --record-samples DIR: each step's sample indices are appended to
  // DIR/samples.g<generation>.r<rank>, one line "<step> <epoch> <index>..." per step, so that a
  // test can check which samples every epoch saw. --stop-after-step N: a commit after step N, and
  // every rank leaves as for a resize. --step-delay-ms MS: a pause after each step, so that a test
  // can change the hosts while the job trains.
  std::string record_samples;
  std::int64_t stop_after_step = 0;
  std::int64_t step_delay_ms = 0;

  // Declares --crash-rank and --crash-after-step on `app` and, for a trainer with an elastic mode
  // (its flag `elastic`), --record-samples, --stop-after-step and --step-delay-ms, which need it.
  // They go into an option group without a name, which --help leaves out.
  void add_flags(CLI::App& app, CLI::Option* elastic = nullptr) {
    auto* testing = app.add_option_group("", "the test suite's flags");
    auto* rank = testing->add_option("--crash-rank", crash_rank)->check(at_least(0));
    auto* step = testing->add_option("--crash-after-step", crash_after_step)
                     ->check(at_least<std::int64_t>(1));
    rank->needs(step);
    step->needs(rank);
    if (elastic == nullptr) return;
    testing->add_option("--record-samples", record_samples)
        ->check(CLI::ExistingDirectory)
        ->needs(elastic);
    testing->add_option("--stop-after-step", stop_after_step)
        ->check(at_least<std::int64_t>(1))
        ->needs(elastic);
    testing->add_option("--step-delay-ms", step_delay_ms)
        ->check(at_least<std::int64_t>(0))
        ->needs(elastic);
  }

  // On every rank after each step. After the step of --crash-after-step, in a run that did not
  // resume: `settle()` on every rank (the trainer waits there for its checkpoint writes and for
  // the other ranks, so that the restart's starting point is known), then --crash-rank dies.
  template <class Settle>
  void after_step(std::int64_t step, bool resumed, int rank, Settle&& settle) const {
    if (crash_rank < 0 || step != crash_after_step || resumed) return;
    settle();
    if (rank == crash_rank) std::raise(SIGKILL);
  }

  // Elastic mode, on every rank after each step: records the step's samples, then pauses.
  void after_elastic_step(std::int64_t generation, int rank, std::int64_t step, std::int64_t epoch,
                          std::span<const std::int64_t> samples) const {
    if (!record_samples.empty()) {
      const std::string path = record_samples + "/samples.g" + std::to_string(generation) + ".r" +
                               std::to_string(rank);
      std::string line = std::to_string(step) + " " + std::to_string(epoch);
      for (const auto index : samples) line += " " + std::to_string(index);
      line += '\n';
      // Opened for each line and closed after it: whole lines only, even when the process is
      // killed.
      std::FILE* file = std::fopen(path.c_str(), "a");
      if (file == nullptr) throw std::runtime_error("cannot open " + path);
      std::fputs(line.c_str(), file);
      std::fclose(file);
    }
    if (step_delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(step_delay_ms));
  }

  // Elastic mode: whether to commit after `step` and leave as for a resize.
  bool stop_after(std::int64_t step) const {
    return stop_after_step > 0 && step == stop_after_step;
  }
};

}  // namespace examples
