// A complete data-parallel trainer with no framework: a 1-hidden-layer MLP classifying three
// interleaved spirals, weights and gradients in std::vectors, backpropagation and SGD written by
// hand. The lines marked "dtrain:" are all it takes to run it on many processes:
//
//   mpiexec -n 4 ./plain_train --epochs 30
//   mpiexec -n 4 ./plain_train --epochs 30 --checkpoint-dir ckpt --resume   (restartable)
//   dtrainrun --min-np 2 --max-np 8 --host-discovery-script ./hosts.sh -- ./plain_train
//       --elastic --checkpoint-dir /dev/shm/plain --checkpoint-every 20   (elastic)
//
// With DTRAIN_PROFILE=<folder> each rank also records where its steps spend their time, with no
// line of profiling code here (docs/profiling.md), and `dtrain-report <folder> -o report.html`
// explains it.
//
// Every rank builds the same dataset and trains on its own shard of each epoch; gradients are
// averaged across ranks before every step, so the ranks stay identical and N ranks with batch b
// train like one process with batch N·b. With --checkpoint-dir, a job that is killed and started
// again with --resume ends with exactly the weights of a job that was never interrupted.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <numbers>
#include <optional>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "common/cli.hpp"
#include "common/testing_hooks.hpp"
#include "dtrain/dtrain.hpp"

namespace {

// ---- options ------------------------------------------------------------------------------------

struct Options {
  int epochs = 20;
  int batch_size = 32;          // per rank
  double lr = 0.05;             // single-process rate; scaled by the world size after warmup
  double warmup_epochs = 2;
  double momentum = 0.9;
  int hidden = 64;
  int samples = 3000;
  std::uint64_t seed = 1;
  double jitter = 0;                 // augmentation: uniform input noise of this amplitude
  std::string checkpoint_dir;        // empty: no checkpoints
  std::int64_t checkpoint_every = 0; // steps between checkpoints; 0: at the end of each epoch only
  int keep_checkpoints = 3;
  bool resume = false;
  bool elastic = false;              // commits on each host, resizes by dtrainrun (train_elastic)
  std::string job_name;              // elastic: the job whose commits to resume; empty: dtrainrun's
  bool resume_other_job = false;     // elastic: resume the newest commit of any job
  examples::TestingHooks testing;
};

void add_options(CLI::App& app, Options& o) {
  using examples::at_least;
  examples::describe_program(
      app, "Trains a small MLP on three interleaved spirals, data-parallel over the ranks of "
           "mpiexec or dtrainrun, with no framework.");
  app.add_option("--epochs", o.epochs, "training epochs")->check(at_least(1));
  app.add_option("--batch-size", o.batch_size, "samples per step on each rank")->check(at_least(1));
  app.add_option("--lr", o.lr, "one process's learning rate, scaled by the ranks after the warmup")
      ->check(examples::positive());
  app.add_option("--warmup-epochs", o.warmup_epochs, "epochs of the ramp to the scaled rate")
      ->check(examples::non_negative());
  app.add_option("--momentum", o.momentum, "SGD momentum")->check(examples::fraction());
  app.add_option("--hidden", o.hidden, "units of the hidden layer")->check(at_least(1));
  app.add_option("--samples", o.samples, "samples of the dataset")->check(at_least(1));
  app.add_option("--seed", o.seed, "seed of the data, the weights and the order")
      ->check(examples::number<std::uint64_t>(">= 0", [](std::uint64_t) { return true; }));
  app.add_option("--jitter", o.jitter, "augmentation: uniform input noise of this amplitude")
      ->check(examples::non_negative());
  auto* dir = app.add_option("--checkpoint-dir", o.checkpoint_dir,
                             "checkpoint into DIR at the end of each epoch; with --elastic, each "
                             "host's own folder ({host}: its name)")
                  ->type_name("DIR");
  app.add_option("--checkpoint-every", o.checkpoint_every, "also every N steps (0: epoch ends only)")
      ->check(at_least<std::int64_t>(0))
      ->needs(dir);
  app.add_option("--keep-checkpoints", o.keep_checkpoints, "keep the newest K (0: all)")
      ->check(at_least(0));
  app.add_flag("--resume", o.resume, "continue from the newest valid checkpoint in DIR, if any")
      ->needs(dir);
  auto* elastic = app.add_flag("--elastic", o.elastic,
                               "train under dtrainrun's elastic mode (docs/elastic.md): resume "
                               "the newest commit any host holds; a resize ends the world with "
                               "75; every epoch trains on every sample exactly once")
                      ->needs(dir);
  app.add_option("--job-name", o.job_name,
                 "resume the commits of every run with this name (default: this dtrainrun's)")
      ->needs(elastic);
  app.add_flag("--resume-other-job", o.resume_other_job,
               "resume the newest commit whoever wrote it")
      ->needs(elastic);
  o.testing.add_flags(app, elastic);
}

// ---- data: three interleaved spirals -----------------------------------------------------------

constexpr int kFeatures = 2;
constexpr int kClasses = 3;

struct Dataset {
  std::vector<float> x;    // [n, kFeatures]
  std::vector<int> label;  // [n]
  std::int64_t size() const { return static_cast<std::int64_t>(label.size()); }
};

// Deterministic from the seed, so every rank builds the same dataset without any communication.
Dataset make_spirals(int n, std::uint64_t seed) {
  std::mt19937_64 gen(seed);
  auto uniform = [&] { return static_cast<double>(gen() >> 11) * 0x1.0p-53; };
  Dataset d;
  for (int i = 0; i < n; ++i) {
    const int c = i % kClasses;
    const double t = uniform();  // position along the arm
    const double angle = 2 * std::numbers::pi * (c / 3.0 + 0.75 * t) + 0.2 * (uniform() - 0.5);
    d.x.push_back(static_cast<float>(t * std::cos(angle)));
    d.x.push_back(static_cast<float>(t * std::sin(angle)));
    d.label.push_back(c);
  }
  return d;
}

// ---- model: features -> hidden (ReLU) -> class logits ------------------------------------------

struct Mlp {
  int hidden;
  std::vector<float> w1, b1, w2, b2;  // [hidden, kFeatures], [hidden], [kClasses, hidden], [kClasses]

  Mlp(int h, std::uint64_t seed)
      : hidden(h), w1(h * kFeatures), b1(h), w2(kClasses * h), b2(kClasses) {
    std::mt19937_64 gen(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (auto& v : w1) v = normal(gen) * std::sqrt(2.0f / kFeatures);
    for (auto& v : w2) v = normal(gen) * std::sqrt(1.0f / h);
  }

  // Named views of the weights, in any order: broadcast_parameters matches them by name.
  std::vector<std::pair<std::string, std::span<float>>> named_parameters() {
    return {{"fc1.weight", w1}, {"fc1.bias", b1}, {"fc2.weight", w2}, {"fc2.bias", b2}};
  }

  // dtrain: how the model goes into a checkpoint (Note [Object serialization]).
  friend void dtrain_serialize(dtrain::ObjectWriter& w, const Mlp& m) {
    w.write(m.w1);
    w.write(m.b1);
    w.write(m.w2);
    w.write(m.b2);
  }
  friend void dtrain_deserialize(dtrain::ObjectReader& r, Mlp& m) {
    const std::size_t sizes[] = {m.w1.size(), m.b1.size(), m.w2.size(), m.b2.size()};
    r.read(m.w1);
    r.read(m.b1);
    r.read(m.w2);
    r.read(m.b2);
    if (m.w1.size() != sizes[0] || m.b1.size() != sizes[1] || m.w2.size() != sizes[2] ||
        m.b2.size() != sizes[3])
      throw std::runtime_error(fmt::format(
          "plain_train: the checkpoint's model has {} hidden units, this one {}: resume with the "
          "same --hidden", m.b1.size(), sizes[1]));
  }
};

struct BatchResult {
  double loss = 0;  // mean cross-entropy over the batch
  int correct = 0;
};

// One batch gathered from the dataset, and the activations forward keeps for backward.
struct Batch {
  std::vector<float> x;    // [size, kFeatures]
  std::vector<int> label;  // [size]
  std::size_t size() const { return label.size(); }
};

struct Activations {
  std::vector<float> h;  // [batch, hidden], after ReLU
  std::vector<float> p;  // [batch, kClasses], softmax probabilities
};


// The batch's inputs, plus `noise` (empty, or kFeatures values per sample) when augmenting.
void gather_batch(const Dataset& data, std::span<const std::int64_t> indices,
                  std::span<const float> noise, Batch& batch) {
  batch.x.resize(indices.size() * kFeatures);
  batch.label.resize(indices.size());
  for (std::size_t b = 0; b < indices.size(); ++b) {
    const std::int64_t i = indices[b];
    for (int j = 0; j < kFeatures; ++j)
      batch.x[b * kFeatures + j] =
          noise.empty() ? data.x[i * kFeatures + j] : data.x[i * kFeatures + j] + noise[b * kFeatures + j];
    batch.label[b] = data.label[i];
  }
}

BatchResult forward(const Mlp& m, const Batch& batch, Activations& a) {
  const std::size_t n = batch.size();
  a.h.resize(n * m.hidden);
  a.p.resize(n * kClasses);
  BatchResult result;
  for (std::size_t b = 0; b < n; ++b) {
    const float* x = &batch.x[b * kFeatures];
    float* h = &a.h[b * m.hidden];
    for (int u = 0; u < m.hidden; ++u) {
      float z = m.b1[u];
      for (int j = 0; j < kFeatures; ++j) z += m.w1[u * kFeatures + j] * x[j];
      h[u] = std::max(z, 0.0f);
    }
    float logits[kClasses];
    for (int c = 0; c < kClasses; ++c) {
      float z = m.b2[c];
      for (int u = 0; u < m.hidden; ++u) z += m.w2[c * m.hidden + u] * h[u];
      logits[c] = z;
    }
    // Softmax cross-entropy, shifted by the max logit for stability.
    const float top = *std::max_element(logits, logits + kClasses);
    float sum = 0;
    float* p = &a.p[b * kClasses];
    for (int c = 0; c < kClasses; ++c) sum += p[c] = std::exp(logits[c] - top);
    for (int c = 0; c < kClasses; ++c) p[c] /= sum;
    const int y = batch.label[b];
    result.loss += -std::log(std::max(p[y], 1e-12f));
    if (std::max_element(p, p + kClasses) - p == y) ++result.correct;
  }
  if (n > 0) result.loss /= static_cast<double>(n);
  return result;
}

// scale x d(summed loss)/d(weights) into `grads` (w1, b1, w2, b2 order), from forward's
// activations: scale 1/n gives the gradient of the batch's mean loss.
void backward(const Mlp& m, const Batch& batch, const Activations& a, float scale,
              std::vector<std::vector<float>>& grads) {
  for (auto& g : grads) std::fill(g.begin(), g.end(), 0.0f);
  auto &gw1 = grads[0], &gb1 = grads[1], &gw2 = grads[2], &gb2 = grads[3];
  const std::size_t n = batch.size();
  std::vector<float> dh(m.hidden);
  for (std::size_t b = 0; b < n; ++b) {
    const float* x = &batch.x[b * kFeatures];
    const float* h = &a.h[b * m.hidden];
    const float* p = &a.p[b * kClasses];
    std::fill(dh.begin(), dh.end(), 0.0f);
    for (int c = 0; c < kClasses; ++c) {
      const float dz = (p[c] - (c == batch.label[b] ? 1.0f : 0.0f)) * scale;
      gb2[c] += dz;
      for (int u = 0; u < m.hidden; ++u) {
        gw2[c * m.hidden + u] += dz * h[u];
        dh[u] += dz * m.w2[c * m.hidden + u];
      }
    }
    for (int u = 0; u < m.hidden; ++u) {
      if (h[u] <= 0) continue;  // ReLU gate
      gb1[u] += dh[u];
      for (int j = 0; j < kFeatures; ++j) gw1[u * kFeatures + j] += dh[u] * x[j];
    }
  }
}

// ---- optimizer: SGD with momentum --------------------------------------------------------------

// dtrain's Optimizer concept needs only step() and gradients() (a range of tensors, in the same
// order on every rank); std::span<float> is a tensor, so the gradients are handed out as views.
class Sgd {
 public:
  Sgd(Mlp& model, double momentum) : model_(&model), momentum_(static_cast<float>(momentum)) {
    for (auto p : params()) {
      grads_.emplace_back(p.size(), 0.0f);
      velocity_.emplace_back(p.size(), 0.0f);
    }
  }

  void step() {
    auto ps = params();
    for (std::size_t t = 0; t < ps.size(); ++t)
      for (std::size_t i = 0; i < ps[t].size(); ++i) {
        velocity_[t][i] = momentum_ * velocity_[t][i] + grads_[t][i];
        ps[t][i] -= lr * velocity_[t][i];
      }
  }
  std::vector<std::span<float>> gradients() {
    return {grads_.begin(), grads_.end()};
  }
  std::vector<std::vector<float>>& gradient_buffers() { return grads_; }

  // dtrain: the optimizer's state in a checkpoint: its momentum buffers (the rate comes from the
  // schedule at every step).
  friend void dtrain_serialize(dtrain::ObjectWriter& w, const Sgd& s) { w.write(s.velocity_); }
  friend void dtrain_deserialize(dtrain::ObjectReader& r, Sgd& s) {
    const std::size_t tensors = s.velocity_.size();
    r.read(s.velocity_);
    if (s.velocity_.size() != tensors)
      throw std::runtime_error("plain_train: the checkpoint's optimizer has a different shape");
  }

  float lr = 0.01f;

 private:
  std::vector<std::span<float>> params() {
    return {model_->w1, model_->b1, model_->w2, model_->b2};
  }
  Mlp* model_;
  float momentum_;
  std::vector<std::vector<float>> grads_, velocity_;
};

// FNV-1a over the weights' bytes: equal fingerprints mean (practically) bitwise-equal weights.
std::uint64_t fingerprint(const Mlp& m) {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  for (const auto* v : {&m.w1, &m.b1, &m.w2, &m.b2}) {
    const auto* p = reinterpret_cast<const unsigned char*>(v->data());
    for (std::size_t i = 0; i < v->size() * sizeof(float); ++i) h = (h ^ p[i]) * 0x100000001b3ULL;
  }
  return h;
}

// One optimizer step and the buffers every step reuses.
struct StepRunner {
  const Options& o;
  const Dataset& data;
  Mlp& model;
  Sgd& sgd;
  dtrain::DistributedOptimizer<Sgd>& optimizer;
  std::mt19937_64& jitter_rng;
  Batch batch;
  Activations activations;
  std::vector<float> noise;

  // Trains on `picked` (this rank's samples of the step; none is allowed). `scale` turns the
  // summed gradient of these samples into this rank's part of the average across ranks.
  BatchResult run(std::span<const std::int64_t> picked, float scale, double lr) {
    noise.clear();
    for (std::size_t k = 0; o.jitter > 0 && k < picked.size() * kFeatures; ++k)
      noise.push_back(static_cast<float>(o.jitter * (2 * ((jitter_rng() >> 11) * 0x1.0p-53) - 1)));
    gather_batch(data, picked, noise, batch);
    const BatchResult r = forward(model, batch, activations);
    backward(model, batch, activations, scale, sgd.gradient_buffers());
    sgd.lr = static_cast<float>(lr);
    optimizer.step();  // dtrain: average the gradients across ranks, then update
    return r;
  }
};

// Where a run starts: after a resume, the step and epoch it continues from.
struct StartingPoint {
  std::int64_t step = 0;
  std::int64_t first_epoch = 0;
  bool resumed = false;
};

// dtrain: this job's newest commit any host holds, the sampler re-sharding the rest of its epoch
// over this world.
StartingPoint resume_from_commit(dtrain::elastic::State& elastic, Mlp& model, Sgd& sgd,
                                 dtrain::DistributedSampler& sampler, std::int64_t n) {
  auto restored = elastic.restore();
  if (!restored) return {};
  restored->load("model", model);
  restored->load("optimizer", sgd);  // momentum intact across the resize
  const auto position = restored->get<dtrain::SamplerState>("sampler");
  sampler.load_state(position);
  const StartingPoint start{restored->step(), position.epoch, true};
  const int world = dtrain::size();
  if (dtrain::rank() == 0)
    fmt::print("resumed from the commit of step {}: epoch {}, sample {} of {} in it (committed "
               "by {} ranks{})\n",
               start.step, start.first_epoch + 1, position.position, n, restored->world_size(),
               restored->world_size() == world ? "" : fmt::format(", re-sharded over {}", world));
  return start;
}

// dtrain: the newest valid checkpoint in --checkpoint-dir (collective: rank 0 reads, every rank
// loads), if there is one.
StartingPoint resume_from_checkpoint(const Options& o, dtrain::Checkpoint& checkpoint, Mlp& model,
                                     Sgd& sgd, std::mt19937_64& jitter_rng,
                                     dtrain::DistributedSampler& sampler, std::int64_t n) {
  auto restored = checkpoint.restore();
  if (!restored) {
    if (dtrain::rank() == 0) fmt::print("no checkpoint in {}: starting afresh\n", o.checkpoint_dir);
    return {};
  }
  restored->load("model", model);
  restored->load("optimizer", sgd);
  if (o.jitter > 0) restored->load("jitter_rng", jitter_rng);
  const auto position = restored->get<dtrain::SamplerState>("sampler");
  sampler.load_state(position);
  const StartingPoint start{restored->step(), position.epoch, true};
  const int world = dtrain::size();
  if (dtrain::rank() == 0)
    fmt::print("resumed from {}: step {}, epoch {}, sample {} of {} in it (saved by {} ranks{})\n",
               restored->file(), start.step, start.first_epoch + 1, position.position, n,
               restored->world_size(),
               restored->world_size() == world ? "" : fmt::format(", re-sharded over {}", world));
  return start;
}

// Elastic mode (docs/elastic.md): the job runs as a sequence of worlds that dtrainrun starts and
// resizes. An epoch is every sample exactly once, whatever worlds it spans: the rest of the
// epoch's order from the committed position is strided over this world's ranks, each step takes
// world x batch samples of it and the last step takes what is left, so a rank's share of a step
// can be smaller than the batch, or empty. Gradients are summed per rank and scaled so that the
// average across ranks is the mean over the step's samples, as one process would compute it.
int train_elastic(const Options& o, const Dataset& data, Mlp& model, Sgd& sgd,
                  dtrain::DistributedOptimizer<Sgd>& optimizer) {
  const int rank = dtrain::rank(), world = dtrain::size();
  const std::int64_t n = data.size();
  // dtrain: commits to this host's own folder; dtrainrun is asked at each one whether to resize.
  dtrain::elastic::State elastic({.directory = o.checkpoint_dir,
                                  .commit_every = o.checkpoint_every,
                                  .keep_last = o.keep_checkpoints,
                                  .job_name = o.job_name,
                                  .on_other_job = o.resume_other_job
                                                      ? dtrain::elastic::OtherJobCommits::resume
                                                      : dtrain::elastic::OtherJobCommits::skip});
  dtrain::DistributedSampler sampler(n, {.parts = world, .part = rank},
                                     {.shuffle = true, .seed = o.seed});
  auto [step, first_epoch, resumed] = resume_from_commit(elastic, model, sgd, sampler, n);
  const std::int64_t per_step = static_cast<std::int64_t>(world) * o.batch_size;
  // dtrain: the schedule of this world's size, read by epochs, which mean the same in every world.
  dtrain::LrScheduleOptions lr_options;
  lr_options.base_lr = o.lr;
  lr_options.world_size = world;
  lr_options.warmup_epochs = o.warmup_epochs;
  lr_options.steps_per_epoch = (n + per_step - 1) / per_step;
  const dtrain::LrSchedule schedule(lr_options);
  // Augmentation noise per rank, seeded afresh by each world: a commit holds no per-rank state.
  std::mt19937_64 jitter_rng(o.seed * 7919 + static_cast<std::uint64_t>(rank) +
                             1000003 * static_cast<std::uint64_t>(step));
  if (rank == 0)
    fmt::print("generation {} training on {} ranks: {} samples, batch {} per rank ({} global), "
               "peak lr {}\n",
               elastic.generation(), world, n, o.batch_size, per_step, schedule.peak_lr());

  const auto commit = [&](std::int64_t epoch, const dtrain::SamplerState& position) {
    elastic.commit({.step = step, .epoch = epoch},
                   {{"model", model}, {"optimizer", sgd}, {"sampler", position}});
    if (elastic.resize_requested() || o.testing.stop_after(step)) {  // dtrain: the same everywhere
      if (rank == 0) {
        fmt::print("generation {}: committed step {}; leaving for the next world\n",
                   elastic.generation(), step);
        std::fflush(stdout);
      }
      elastic.exit_for_resize();  // dtrain: every rank exits with 75
    }
  };
  dtrain::MetricAverager metrics;
  dtrain::ThroughputMeter throughput;
  StepRunner steps{o, data, model, sgd, optimizer, jitter_rng, {}, {}, {}};
  const std::int64_t first_step = step;
  for (std::int64_t epoch = first_epoch; epoch < o.epochs; ++epoch) {
    sampler.set_epoch(epoch);
    const auto indices = sampler.indices();  // padded to an equal length: the tail is not used
    const std::int64_t start = sampler.state(0).position;
    const std::int64_t left = n - start;  // samples of the epoch not trained yet
    // This rank takes positions start + rank, start + rank + world, ... below n.
    const std::int64_t mine = std::max<std::int64_t>(0, (left - rank + world - 1) / world);
    const std::int64_t epoch_steps = (left + per_step - 1) / per_step;
    throughput.start_epoch();
    for (std::int64_t b = 0; b < epoch_steps; ++b) {
      const std::int64_t from = std::min(b * o.batch_size, mine);
      const std::int64_t to = std::min((b + 1) * o.batch_size, mine);
      const std::span<const std::int64_t> picked(indices.data() + from,
                                                 static_cast<std::size_t>(to - from));
      const std::int64_t in_step = std::min(per_step, left - b * per_step);
      const double lr =
          schedule.lr_at_epoch(epoch + static_cast<double>(start + b * per_step) / n);
      const BatchResult r =
          steps.run(picked, static_cast<float>(world) / static_cast<float>(in_step), lr);
      ++step;
      o.testing.after_elastic_step(elastic.generation(), rank, step, epoch, picked);
      const auto count = static_cast<double>(picked.size());
      metrics.add("loss", r.loss, count);
      metrics.add("accuracy", count > 0 ? r.correct / count : 0.0, count);
      throughput.add_samples(static_cast<std::int64_t>(picked.size()));
      if (step == first_step + 1 && rank == 0) {
        fmt::print("generation {}: step {} done on {} ranks\n", elastic.generation(), step, world);
        std::fflush(stdout);
      }
      if (b + 1 < epoch_steps && (elastic.commit_due(step) || o.testing.stop_after(step)))
        commit(epoch, sampler.state((b + 1) * o.batch_size));
    }
    const auto m = metrics.average();
    const auto t = throughput.end_epoch();
    if (rank == 0)
      fmt::print("epoch {:3d} loss {:.4f} accuracy {:.3f} lr {:.4f} samples/s {:.0f}\n", epoch + 1,
                 m.at("loss"), m.at("accuracy"), sgd.lr, t.samples_per_second);
    sampler.set_epoch(epoch + 1);  // committed as the start of the next epoch
    if (epoch + 1 < o.epochs) commit(epoch + 1, sampler.state(0));
  }
  if (first_epoch < o.epochs) {
    sampler.set_epoch(o.epochs);
    // The end: a resize asked for at this commit changes nothing.
    elastic.commit({.step = step, .epoch = o.epochs},
                   {{"model", model}, {"optimizer", sgd}, {"sampler", sampler.state(0)}});
  }
  elastic.wait();
  if (rank == 0) fmt::print("final: step {} weights {:016x}\n", step, fingerprint(model));
  return 0;
}

int train(const Options& o) {
  const int rank = dtrain::rank(), world = dtrain::size();

  const Dataset data = make_spirals(o.samples, o.seed);
  // Each rank initializes its own weights (a different seed on purpose) ...
  Mlp model(o.hidden, o.seed * 1000 + static_cast<std::uint64_t>(rank));
  // dtrain: ... and then every rank starts from rank 0's.
  dtrain::broadcast_parameters(model.named_parameters(), 0);

  Sgd sgd(model, o.momentum);
  dtrain::DistributedOptimizer<Sgd> optimizer(sgd);  // dtrain: average gradients in step()
  if (o.elastic) return train_elastic(o, data, model, sgd, optimizer);

  // dtrain: each rank sees its own shard; every rank gets the same number of batches.
  dtrain::DistributedSampler sampler(data.size(), {.parts = world, .part = rank},
                                     {.shuffle = true, .seed = o.seed});
  const std::int64_t steps_per_epoch = sampler.num_batches(o.batch_size, /*drop_last_batch=*/true);
  if (steps_per_epoch < 1) {
    if (rank == 0)
      std::fprintf(stderr, "plain_train: %d samples over %d ranks leave no full batch of %d\n",
                   o.samples, world, o.batch_size);
    return 2;
  }
  // dtrain: the global batch is world times larger, so the rate is too, reached by a warmup.
  dtrain::LrScheduleOptions lr_options;
  lr_options.base_lr = o.lr;
  lr_options.world_size = world;
  lr_options.warmup_epochs = o.warmup_epochs;
  lr_options.steps_per_epoch = steps_per_epoch;
  const dtrain::LrSchedule schedule(lr_options);

  // Augmentation noise: each rank draws its own, so its generator is per-rank checkpoint state.
  std::mt19937_64 jitter_rng(o.seed * 7919 + static_cast<std::uint64_t>(rank));

  // dtrain: checkpoints, and resuming from the newest valid one.
  std::optional<dtrain::Checkpoint> checkpoint;
  if (!o.checkpoint_dir.empty())
    checkpoint.emplace(dtrain::CheckpointOptions{.directory = o.checkpoint_dir,
                                                 .keep_last = o.keep_checkpoints});
  auto [step, first_epoch, resumed] =
      o.resume ? resume_from_checkpoint(o, *checkpoint, model, sgd, jitter_rng, sampler, data.size())
               : StartingPoint{};
  // Every rank calls save() at the same step; rank 0 writes in the background. The generator is
  // saved only when it is used: per-rank items tie a checkpoint to its world size.
  auto save = [&](std::int64_t epoch, std::int64_t taken) {
    const dtrain::SamplerState position = sampler.state(taken);
    if (o.jitter > 0)
      checkpoint->save({.step = step, .epoch = epoch},
                       {{"model", model}, {"optimizer", sgd}, {"sampler", position}},
                       {{"jitter_rng", jitter_rng}});
    else
      checkpoint->save({.step = step, .epoch = epoch},
                       {{"model", model}, {"optimizer", sgd}, {"sampler", position}});
  };

  if (rank == 0)
    fmt::print("training on {} ranks: {} samples, batch {} per rank ({} global), {} steps/epoch, "
               "peak lr {}\n",
               world, data.size(), o.batch_size, o.batch_size * world, steps_per_epoch,
               schedule.peak_lr());
  dtrain::MetricAverager metrics;
  dtrain::ThroughputMeter throughput;
  StepRunner steps{o, data, model, sgd, optimizer, jitter_rng, {}, {}, {}};
  for (std::int64_t epoch = first_epoch; epoch < o.epochs; ++epoch) {
    sampler.set_epoch(epoch);  // dtrain: a new shuffle each epoch, the same on every rank
    const auto indices = sampler.indices();  // after a resume: the rest of the epoch
    // The same count on every rank (Note [Equal steps on every rank]).
    const auto batches = static_cast<std::int64_t>(indices.size()) / o.batch_size;
    throughput.start_epoch();
    for (std::int64_t b = 0; b < batches; ++b) {
      const std::span<const std::int64_t> picked(indices.data() + b * o.batch_size,
                                                 static_cast<std::size_t>(o.batch_size));
      const BatchResult r = steps.run(picked, 1.0f / static_cast<float>(o.batch_size),
                                      schedule.lr_at_step(step++));
      const Batch& batch = steps.batch;
      metrics.add("loss", r.loss, static_cast<double>(batch.size()));
      metrics.add("accuracy", static_cast<double>(r.correct) / batch.size(),
                  static_cast<double>(batch.size()));
      throughput.add_samples(static_cast<std::int64_t>(batch.size()));
      if (checkpoint && o.checkpoint_every > 0 && step % o.checkpoint_every == 0 && b + 1 < batches)
        save(epoch, (b + 1) * o.batch_size);
      // The checkpoints so far are on disk before a crash, so the restart's starting point is
      // known: the newest one at or before this step.
      o.testing.after_step(step, resumed, rank, [&] {
        if (checkpoint) checkpoint->wait();
        dtrain::barrier();
      });
    }
    if (batches > 0) {
      const auto m = metrics.average();  // dtrain: means over every rank's samples
      const auto t = throughput.end_epoch();
      if (rank == 0)  // dtrain: one rank prints
        fmt::print("epoch {:3d} loss {:.4f} accuracy {:.3f} lr {:.4f} samples/s {:.0f}\n",
                   epoch + 1, m.at("loss"), m.at("accuracy"), sgd.lr, t.samples_per_second);
    }
    if (checkpoint) {
      sampler.set_epoch(epoch + 1);  // saved as the start of the next epoch
      save(epoch + 1, 0);
    }
  }
  if (checkpoint) checkpoint->wait();  // the last checkpoint is on disk (errors surface here)
  if (rank == 0) fmt::print("final: step {} weights {:016x}\n", step, fingerprint(model));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    dtrain::Session session(argc, argv);  // dtrain: start (and at scope exit stop) the runtime
    CLI::App app("", "plain_train");
    Options o;
    add_options(app, o);
    try {
      app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {  // every rank parses the same flags and gets here
      return examples::refused_command_line(app, e, dtrain::rank() == 0);
    }
    try {
      return train(o);
    } catch (const std::exception& e) {  // e.g. a checkpoint this job cannot resume from
      std::fprintf(stderr, "plain_train: rank %d: %s\n", dtrain::rank(), e.what());
      return 1;
    }
  } catch (const std::exception& e) {  // dtrain did not start: a malformed DTRAIN_ setting, say
    std::fprintf(stderr, "plain_train: %s\n", e.what());
    return 1;
  }
}
