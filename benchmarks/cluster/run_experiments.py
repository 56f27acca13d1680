#!/usr/bin/env python3
"""Training across a cluster on one machine: namespaced hosts, rate-limited links, dtrain and its
baselines run interleaved in one run, ratios reported (docs/scaling.md).

    python3 benchmarks/cluster/run_experiments.py --build-dir build --all | tee cluster.log

The build directory must hold bin/dtrainrun, examples/resnet/resnet_train and
benchmarks/bench_{allreduce_bandwidth,autotune_grad_sync} (a Release build with libtorch);
--python names an interpreter with torch for the PyTorch DDP baseline (default: $PYTHON, else
this one; without torch the DDP rows are left out and the run says so).

Before anything is shaped the harness measures, on one host alone, the trainer's step time
(T_comp) and its gradient bytes (G), and derives the link rate from a profile
(benchmarks/cluster/profiles.py): the rate at which a step here spends the same share of its
time in the allreduce as on the target cluster. Every experiment starts by measuring what a
link really carries (one TCP stream between two hosts) and stops if the shaping did not apply.

Experiments (--experiment, comma-separated; --all runs them in this order):
  wait          what waiting for a link-bound allreduce costs a rank (bench_wait_cost, 64 MiB, 2
                hosts x 1 rank, each pinned to its host's core): the cores a rank uses while its
                main thread sleeps and how much slower compute beside it runs, for dtrain,
                dtrain never sleeping and raw MPI_Allreduce on a helper thread; then the sleep
                cap (DTRAIN_WAIT_MAX_SLEEP_US) against transfer time, at --wait-rates
  link          allreduce times across 2 hosts over sizes: fits alpha (per message) and beta
                (bytes/s) for scaling_model.py
  training      examples/resnet, 1 host x 1 rank vs H hosts x 1 rank (--hosts, default 2,3):
                dtrain default, dtrain with gradient buckets (--bucket-mb, overlapping
                backward), dtrain fp16 compression (where the trainer has --compression),
                PyTorch DDP (gloo) and its single-process baseline; images/s, scaling
                efficiency, dtrain/DDP step ratios
  hierarchical  2 hosts x 2 ranks on a slow link: DTRAIN_HIERARCHICAL_ALLREDUCE 0 vs 1, a
                16 MiB allreduce (with raw MPI beside it) and a training run
  autotune      bench_autotune_grad_sync (tuned vs default vs worst tried) and a training run
                tuned with DTRAIN_AUTOTUNE=1, then default, tuned and worst trained again
  buckets       2 hosts x 1 rank at links from fast to slow (comm/compute ratio rho, see
                profiles.py): one bucket per step (the CPU default on one host) against buckets
                of 0 (each gradient as backward makes it), 4 and 25 MiB: where overlap starts
                to pay; with --buckets-cpu-operations mpi,gloo each again over Gloo, with
                --buckets-ddp PyTorch DDP beside them

A full run (--all, defaults) takes about 2 hours on a 2-core machine (an estimate from the
step times of short runs); --quick checks every step in 6 to 8 minutes (its numbers mean
nothing).

Exit status: 0 done; 77 namespaces or tc shaping are not permitted here; 1 a failure (a job
failed, or a link did not carry its set rate).
"""
import argparse
import csv
import json
import math
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import netns_cluster as nc  # noqa: E402
import profiles  # noqa: E402

EXPERIMENTS = ("wait", "link", "training", "hierarchical", "autotune", "buckets")
ONE_BUCKET_MB = 1 << 20  # --bucket-mb that holds every gradient of a step: one bucket per step
DDP_SCRIPT = os.path.join(HERE, "..", "ddp_resnet.py")
LINK_TOLERANCE = 0.25
EXIT_GRACE_S = 15
CLUSTER_PREFIX = "dtrain-cluster-"
# One TCP stream over a shaped veth carries about 95.7% of the set rate: tbf/htb count whole
# Ethernet frames, TCP's payload is 1448 of every 1514 bytes at MTU 1500.
TCP_PAYLOAD_SHARE = 1448 / 1514


class Failure(Exception):
    pass


def log(message=""):
    print(message, flush=True)


def parse_time(text):
    value, unit = text.split()
    return float(value) * {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}[unit]


def median(values):
    return statistics.median(values) if values else float("nan")


def rotated(items, r):
    """The order of round r: every variant takes every position in turn, so none always runs
    first or after the same neighbour."""
    r %= len(items)
    return items[r:] + items[:r]


class Harness:
    def __init__(self, args):
        self.args = args
        build = args.build_dir
        self.dtrainrun = os.environ.get("DTRAINRUN") or os.path.join(build, "bin", "dtrainrun")
        self.trainer = os.path.join(build, "examples", "resnet", "resnet_train")
        self.bench_bandwidth = os.path.join(build, "benchmarks", "bench_allreduce_bandwidth")
        self.bench_autotune = os.path.join(build, "benchmarks", "bench_autotune_grad_sync")
        self.bench_wait = os.path.join(build, "benchmarks", "bench_wait_cost")
        self.python = args.python or os.environ.get("PYTHON") or sys.executable
        self.results = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                        "machine": machine_info(), "args": vars(args), "links": [],
                        "notes": []}
        self.cluster = None
        self.port = 29600
        self.port_lock = threading.Lock()
        self.scratch = None

    # -- set-up ----------------------------------------------------------------------------

    def check_inputs(self, experiments):
        needed = [self.dtrainrun, self.trainer]
        if "link" in experiments or "hierarchical" in experiments:
            needed.append(self.bench_bandwidth)
        if "autotune" in experiments:
            needed.append(self.bench_autotune)
        if "wait" in experiments:
            needed.append(self.bench_wait)
        missing = [p for p in needed if not os.access(p, os.X_OK)]
        if missing:
            raise Failure("missing programs (build them in --build-dir): " + ", ".join(missing))
        self.has_compression = self.has_torch = self.has_powersgd = self.has_adasum = False
        self.has_shard_gradients = False
        if "buckets" in experiments and self.args.buckets_ddp:
            self.has_torch = self.python_has_torch()
        if "training" not in experiments:
            return
        help_text = subprocess.run([self.trainer, "--help"], capture_output=True, text=True,
                                   timeout=120).stdout
        if "--batch-size" not in help_text:
            raise Failure(f"{self.trainer} --help printed no usage:\n{help_text}")
        self.has_compression = "--compression" in help_text
        self.has_powersgd = "--powersgd-rank" in help_text
        self.has_adasum = "adasum" in help_text
        self.has_shard_gradients = "gradients" in help_text and "--shard" in help_text
        if not self.has_compression:
            self.note("examples/resnet has no --compression flag: the 'dtrain fp16' variant "
                      "(DistributedOptimizerOptions::compression = fp16) cannot run from the "
                      "command line")
        self.has_torch = self.python_has_torch()

    def python_has_torch(self):
        done = subprocess.run([self.python, "-c", "import torch; print(torch.__version__)"],
                              capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            self.note(f"{self.python} cannot import torch: the PyTorch DDP rows are left out "
                      f"(--python)")
        return done.returncode == 0

    def note(self, text):
        log(f"note: {text}")
        if text not in self.results["notes"]:
            self.results["notes"].append(text)

    def layout(self):
        """CPUs per host: the hosts of a real cluster do not share cores, so each host gets
        its own where this machine has enough; otherwise they share all of them and every
        ratio includes this machine's contention (said in the output)."""
        cores = sorted(os.sched_getaffinity(0))
        hosts = self.max_hosts
        per_host = len(cores) // hosts
        if per_host >= 1:
            self.cpus = [",".join(map(str, cores[i * per_host:(i + 1) * per_host]))
                         for i in range(hosts)]
            self.cpus_per_host = per_host
            log(f"layout: {hosts} hosts, {per_host} cores each ({'; '.join(self.cpus)})")
        else:
            self.cpus, self.cpus_per_host = None, len(cores)
            log(f"layout: {hosts} hosts SHARE {len(cores)} cores: oversubscribed, every ratio "
                f"below includes this machine's CPU contention")
        self.results["layout"] = {"hosts": hosts, "cpus": self.cpus, "cores": len(cores)}

    def threads(self, slots):
        if self.args.threads > 0:
            return self.args.threads
        return max(1, self.cpus_per_host // slots)

    # -- jobs ------------------------------------------------------------------------------

    def job_env(self, extra=None):
        # The user's own dtrain settings would change what is measured: start clean.
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("DTRAIN_", "HOROVOD_", "DTRAINRUN_"))}
        env.update(extra or {})
        return env

    def dtrain(self, hosts, slots, argv, env=None, what="job", complete=None):
        """Runs argv as `len(hosts) x slots` ranks; returns the ranks' output.

        complete(output) says when the program's work is done. A job whose work is done but
        that has not exited EXIT_GRACE_S later is ended, and a note says so: programs that own
        MPI (the benchmarks) can hang in MPI_Finalize across hosts over TCP, which dtrain's own
        shutdown avoids (Note [Finalize over TCP] in include/dtrain/runtime/runtime.hpp).
        """
        if len(hosts) == 1:
            launch = [self.dtrainrun, "-np", str(slots), "--no-prefix", "--", *argv]
        else:
            launch = [self.dtrainrun, "-H", self.cluster.host_list(slots, hosts),
                      "--launcher-agent", self.cluster.agent, "--no-prefix", "--", *argv]
        proc = subprocess.Popen(self.cluster.on(hosts[0], launch), env=self.job_env(env),
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, errors="replace")
        lines = []
        reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
        reader.start()
        deadline = time.monotonic() + self.args.job_timeout
        done_at = None
        try:
            while proc.poll() is None:
                now = time.monotonic()
                if now > deadline:
                    raise Failure(f"{what} did not finish within {self.args.job_timeout} s "
                                  f"(--job-timeout)\n{''.join(lines)}")
                if done_at is None and complete is not None and complete("".join(lines)):
                    done_at = now
                if done_at is not None and now - done_at > EXIT_GRACE_S:
                    self.note(f"{os.path.basename(argv[0])} printed its results but did not "
                              f"exit within {EXIT_GRACE_S} s (hung in MPI_Finalize across "
                              f"hosts); the harness ended it")
                    self.cluster.kill_processes(hosts)
                    proc.wait()
                    reader.join(timeout=10)
                    return "".join(lines)
                time.sleep(0.2)
        finally:
            if proc.poll() is None:
                self.cluster.kill_processes(hosts)
                proc.kill()
                proc.wait()
        reader.join(timeout=10)
        out = "".join(lines)
        if proc.returncode != 0:
            raise Failure(f"{what} exited with {proc.returncode}\n{out}")
        return out

    def train_args(self, world, slots, epochs=None, steps=None):
        a = self.args
        steps = steps or a.steps
        return ["--dataset", "synthetic", "--model", a.model, "--image-size", str(a.image_size),
                "--batch-size", str(a.batch_size), "--epochs", str(epochs or a.epochs),
                "--max-steps-per-epoch", str(steps),
                "--synthetic-samples", str(max(16, world * steps * a.batch_size)),
                "--eval-samples", str(a.batch_size), "--threads", str(self.threads(slots)),
                "--seed", "42"]

    def train(self, hosts, slots=1, flags=(), env=None, what="training", epochs=None,
              steps=None):
        """One run of examples/resnet; images/s (all ranks) per epoch after the first."""
        world = len(hosts) * slots
        argv = [self.trainer, *self.train_args(world, slots, epochs, steps), *flags]
        out = self.dtrain(hosts, slots, argv, env, what,
                          complete=lambda o: re.search(r"^final: ", o, re.MULTILINE))
        rates = [float(m.group(1)) for m in re.finditer(r"^epoch +\d+/\d+ .* ([0-9.]+) img/s",
                                                        out, re.MULTILINE)]
        if len(rates) < 2:
            raise Failure(f"{what}: expected an epoch line per epoch (at least 2):\n{out}")
        m = re.search(r"^model: \S+, (\d+) parameters", out, re.MULTILINE)
        sent = re.search(r"^communicated: ([0-9.]+) MB", out, re.MULTILINE)
        ips = median(rates[1:])
        return {"images_per_second": ips, "epochs": rates,
                "step_seconds": world * self.args.batch_size / ips,
                "parameters": int(m.group(1)) if m else None,
                "payload_mb_per_step": float(sent.group(1)) if sent else None}

    def ddp(self, hosts, slots=1, what="DDP"):
        """PyTorch DDP (gloo) across `hosts`: benchmarks/ddp_resnet.py on each host."""
        a = self.args
        world = len(hosts) * slots
        with self.port_lock:
            self.port += 1
            port = self.port
        common = [self.python, DDP_SCRIPT, "--model", a.model, "--image-size", str(a.image_size),
                  "--batch-size", str(a.batch_size), "--epochs", str(a.epochs), "--steps",
                  str(a.steps), "--samples", str(world * a.steps * a.batch_size), "--threads",
                  str(self.threads(slots)), "--ranks", str(slots), "--nodes", str(len(hosts)),
                  "--master-addr", self.cluster.host(hosts[0]).address, "--port",
                  str(port), "--seed", "42"]
        # gloo finds its interface from the host name, which nothing resolves here.
        env = dict(self.job_env(), GLOO_SOCKET_IFNAME="eth0")
        procs = []
        try:
            for i, h in enumerate(hosts):
                procs.append(subprocess.Popen(
                    self.cluster.on(h, [*common, "--node-rank", str(i)]), env=env,
                    stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                    text=True, errors="replace"))
            outs = []
            deadline = time.monotonic() + self.args.job_timeout
            for p in procs:
                outs.append(p.communicate(timeout=max(1, deadline - time.monotonic()))[0])
        except subprocess.TimeoutExpired:
            raise Failure(f"{what} did not finish within {self.args.job_timeout} s") from None
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.communicate()
        bad = [(i, p.returncode) for i, p in enumerate(procs) if p.returncode != 0]
        if bad:
            raise Failure(f"{what}: hosts {bad} failed\n" + "\n---\n".join(outs))
        m = re.search(r"^RESULT .*step_ms=([0-9.]+) .*img_s=([0-9.]+)", outs[0], re.MULTILINE)
        if not m:
            raise Failure(f"{what}: no RESULT line\n{outs[0]}")
        return {"images_per_second": float(m.group(2)), "step_seconds": float(m.group(1)) / 1e3}

    def alone_at_once(self, hosts, trainer, what):
        """One single-rank job of `trainer` ("dtrain" or "ddp") on each of `hosts`, all at the
        same time, with no communication between them: what each rank's compute alone runs at
        while the other hosts compute too. The hosts of this cluster share the machine's caches
        and memory bandwidth (and, on a VM, perhaps the physical cores behind its CPUs), which a
        rank alone on an idle machine does not feel; this baseline has the same neighbours as a
        multi-host run, so step / this step is what communication adds. Returns the median over
        the jobs of images/s per job."""
        results, errors = [None] * len(hosts), []

        def one(i, h):
            try:
                results[i] = (self.ddp([h], what=f"{what}, host {h}") if trainer == "ddp"
                              else self.train([h], what=f"{what}, host {h}"))
            except Exception as e:  # noqa: BLE001 - re-raised below on the main thread
                errors.append(e)

        threads = [threading.Thread(target=one, args=(i, h)) for i, h in enumerate(hosts)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        ips = median([r["images_per_second"] for r in results])
        return {"images_per_second": ips, "step_seconds": self.args.batch_size / ips,
                "jobs": [r["images_per_second"] for r in results]}

    def bandwidth(self, hosts, slots, sizes, rounds, env=None, what="allreduce"):
        """bench_allreduce_bandwidth: {size bytes: (dtrain seconds, raw MPI seconds)}."""
        units = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
        largest = max(sizes)
        unit = next(u for u in ("GiB", "MiB", "KiB", "B") if largest % units[u] == 0)
        last_row = f"| {largest // units[unit]} {unit} |"
        # Its three tables end with the largest size.
        out = self.dtrain(hosts, slots, [self.bench_bandwidth, f"--rounds={rounds}",
                                         f"--min-bytes={min(sizes)}", f"--max-bytes={largest}"],
                          env, what, complete=lambda o: o.count(last_row) >= 3)
        table = {}
        for m in re.finditer(r"^\| (\d+) (B|KiB|MiB|GiB) \| ([0-9.]+ [mun]?s) \| [0-9.]+ \| "
                             r"([0-9.]+ [mun]?s) \|", out, re.MULTILINE):
            size = int(m.group(1)) * units[m.group(2)]
            if size not in table:  # the first table: Sum, dtrain and raw
                table[size] = (parse_time(m.group(3)), parse_time(m.group(4)))
        if not table:
            raise Failure(f"{what}: no table in the output\n{out}")
        return table

    # -- links -----------------------------------------------------------------------------

    def shape(self, rate_bps, label):
        """Shapes every link to rate_bps (None: unshaped), then measures what one link really
        carries; a shaped link off by more than LINK_TOLERANCE stops the run."""
        self.cluster.shape(rate_bps, self.args.qdisc)
        return self.check_link(label)

    def check_link(self, label):
        rate = self.cluster.rate_bps
        got = self.cluster.measure_throughput(0, 1, self.args.probe_seconds)
        record = {"label": label, "set_bps": rate, "measured_bps": got, "qdisc": self.args.qdisc}
        self.results["links"].append(record)
        if rate is None:
            log(f"link [{label}]: unshaped, one TCP stream carries {nc.format_rate(got)}")
            return got
        log(f"link [{label}]: {self.args.qdisc} at {nc.format_rate(rate)}; one TCP stream "
            f"carries {nc.format_rate(got)} ({got / rate:.2f}x the set rate; TCP payload "
            f"alone would be {TCP_PAYLOAD_SHARE:.2f}x)")
        if abs(got / rate - 1) > LINK_TOLERANCE:
            raise Failure(f"the link carries {nc.format_rate(got)} where it was shaped to "
                          f"{nc.format_rate(rate)}: the shaping did not apply as set\n"
                          + "\n".join(self.cluster.qdisc_lines(0)))
        return got

    # -- calibration -----------------------------------------------------------------------

    def calibrate(self):
        """Ceiling of an unshaped link; this machine's step time and gradient bytes (one rank
        alone); the profile's link rate from them."""
        self.ceiling = self.shape(None, "unshaped ceiling")
        log(f"calibration: {self.args.model}, one rank alone on host 0 "
            f"({self.threads(1)} threads)")
        alone = self.train([0], what="calibration run (1 host x 1 rank)")
        self.compute_s = alone["step_seconds"]
        self.gradient_bytes = 4 * alone["parameters"]
        log(f"  step {1e3 * self.compute_s:.1f} ms ({alone['images_per_second']:.1f} img/s), "
            f"{alone['parameters']} parameters = {self.gradient_bytes / 1e6:.1f} MB of "
            f"gradients per step")
        self.results["calibration"] = {"compute_seconds": self.compute_s,
                                       "gradient_bytes": self.gradient_bytes,
                                       "ceiling_bps": self.ceiling, "run": alone}
        if self.args.link_rate:
            self.rate = nc.parse_rate(self.args.link_rate)
            log(f"link rate: {nc.format_rate(self.rate)} (--link-rate)")
            lines = []
        else:
            target = profiles.TARGETS[self.args.profile]
            self.rate, lines = profiles.describe(target, self.compute_s, self.gradient_bytes)
            for line in lines:
                log(line)
        rho = profiles.comm_compute_ratio(self.gradient_bytes, self.rate, self.compute_s)
        log(f"  here at that rate: rho(2 hosts) = {rho:.3f}")
        if self.rate > 0.7 * self.ceiling:
            self.note(f"the profile asks for {nc.format_rate(self.rate)}, more than 70% of "
                      f"what an unshaped link carries here ({nc.format_rate(self.ceiling)}): the "
                      f"links are shaped to it, but this machine's CPU, not the link, may set "
                      f"the pace")
        self.results["profile"] = {"key": None if self.args.link_rate else self.args.profile,
                                   "rate_bps": self.rate, "rho_2_hosts": rho, "lines": lines}

    # -- experiments -----------------------------------------------------------------------

    def wait_cost(self, env=None, what="wait cost"):
        """bench_wait_cost across hosts 0 and 1: {way: {transfer_s, cores, slowdown}}."""
        a = self.args
        out = self.dtrain([0, 1], 1, [self.bench_wait, f"--mb={a.wait_mb}",
                                      f"--rounds={a.bench_rounds}"],
                          env, what, complete=lambda o: o.count("RESULT way=") >= 4)
        ways = {}
        for m in re.finditer(r'^RESULT way="([^"]+)" transfer_s=([0-9.]+) cores=([0-9.]+) '
                             r'slowdown=([0-9.]+)', out, re.MULTILINE):
            ways[m.group(1)] = {"transfer_s": float(m.group(2)), "cores": float(m.group(3)),
                                "slowdown": float(m.group(4))}
        if len(ways) < 3:
            raise Failure(f"{what}: no RESULT lines in the output\n{out}")
        return ways

    def experiment_wait(self):
        """The core a rank spends waiting for a link-bound allreduce, and the sleep cap."""
        a = self.args
        log(f"\n## wait: one {a.wait_mb} MiB allreduce across 2 hosts x 1 rank (a core each), "
            f"main thread sleeping or computing")
        rows = []
        for label in a.wait_rates.split(","):
            rate = self.rate if label == "profile" else nc.parse_rate(label)
            self.shape(rate, f"wait, {label}")
            ways = self.wait_cost(what=f"wait cost at {nc.format_rate(rate)}")
            caps = {}
            for cap in a.wait_caps.split(","):
                got = self.wait_cost({"DTRAIN_WAIT_MAX_SLEEP_US": cap},
                                     what=f"sleep cap {cap} us at {nc.format_rate(rate)}")
                caps[cap] = got["dtrain"]
            rows.append({"rate_bps": rate, "label": label, "ways": ways, "caps": caps})
            log(f"link {nc.format_rate(rate)}:")
            log("| way | transfer s | cores while waiting | compute slowdown |\n|---|---|---|---|")
            for name, w in ways.items():
                log(f"| {name} | {w['transfer_s']:.3f} | {w['cores']:.2f} | {w['slowdown']:.2f}x |")
            log("| DTRAIN_WAIT_MAX_SLEEP_US | transfer s | cores while waiting | compute slowdown |"
                "\n|---|---|---|---|")
            for cap, w in caps.items():
                log(f"| {cap} | {w['transfer_s']:.3f} | {w['cores']:.2f} | {w['slowdown']:.2f}x |")
        self.results["wait"] = rows

    def experiment_link(self):
        """alpha and beta of dtrain's allreduce across 2 hosts on the profile's link."""
        log("\n## link: allreduce time against size, 2 hosts x 1 rank")
        self.shape(self.rate, "link")
        sizes = [4 << 10, self.args.link_max_bytes]
        table = self.bandwidth([0, 1], 1, sizes, self.args.bench_rounds, what="link allreduce")
        log("| size | dtrain | raw MPI |\n|---|---|---|")
        for size, (t_dtrain, t_raw) in sorted(table.items()):
            log(f"| {size} B | {1e3 * t_dtrain:.3f} ms | {1e3 * t_raw:.3f} ms |")
        fit = fit_alpha_beta(table, hosts=2)
        log(f"fit (dtrain, ring of 2): alpha = {1e6 * fit['alpha_s']:.1f} us per message, "
            f"beta = {fit['beta_bytes_per_s'] * 8 / 1e6:.1f} Mbit/s = "
            f"{fit['beta_bytes_per_s'] * 8 / self.rate:.2f}x the link's set rate")
        fit["link_bps"] = self.rate
        fit["table"] = {str(k): v for k, v in table.items()}
        self.results["alpha_beta"] = fit

    def experiment_training(self):
        a = self.args
        log(f"\n## training: {a.model}, {a.image_size} px, batch {a.batch_size} per rank, "
            f"{a.epochs} epochs x {a.steps} steps (the first epoch not counted), "
            f"{a.rounds} rounds")
        self.shape(self.rate, "training")
        variants = [("dtrain", 1, ())]
        if self.has_torch:
            variants.append(("ddp", 1, ()))
        for h in self.hosts:
            variants.append(("dtrain at once", h, ()))
            if self.has_torch:
                variants.append(("ddp at once", h, ()))
            variants.append(("dtrain", h, ()))
            # Host tensors over MPI (the default, auto, takes Gloo where the job spans hosts).
            variants.append(("dtrain mpi", h, ()))
            variants.append(("dtrain buckets", h, ("--bucket-mb", str(a.bucket_mb))))
            # The allreduce pieces as MPI's nonblocking calls, waited for with sleeps across hosts
            # (DTRAIN_MPI_NONBLOCKING=1; the default is MPI's blocking calls).
            variants.append(("dtrain nonblocking", h, ()))
            variants.append(("dtrain buckets nonblocking", h, ("--bucket-mb", str(a.bucket_mb))))
            if self.has_compression:
                variants.append(("dtrain fp16", h, ("--compression", "fp16")))
            if self.has_powersgd:
                # Compressed from the first step: the timed epochs must not average uncompressed.
                variants.append(("dtrain powersgd", h,
                                 ("--compression", "powersgd", "--powersgd-rank",
                                  str(a.powersgd_rank), "--powersgd-start-step", "0")))
            if self.has_adasum:
                variants.append(("dtrain adasum", h, ("--op", "adasum")))
            if self.has_shard_gradients:
                # ZeRO stages 1 and 2 at their default units (one per step on one host, 25 MiB
                # units for gradients and across hosts), over the default host library.
                variants.append(("dtrain shard optimizer", h, ("--shard", "optimizer")))
                variants.append(("dtrain shard gradients", h, ("--shard", "gradients")))
            # Host tensors over Gloo (DTRAIN_CPU_OPERATIONS=gloo), as DDP's are.
            variants.append(("dtrain gloo", h, ()))
            variants.append(("dtrain buckets gloo", h, ("--bucket-mb", str(a.bucket_mb))))
            if self.has_torch:
                variants.append(("ddp", h, ()))
        if a.training_variants:
            wanted = set(a.training_variants.split(","))
            unknown = wanted - {name for name, _, _ in variants}
            if unknown:
                raise Failure(f"--training-variants: no variant {', '.join(sorted(unknown))}")
            # The single-host baselines stay: every efficiency is measured against them.
            variants = [v for v in variants if v[0] in wanted or v[1] == 1]
        runs = []
        for r in range(a.rounds):
            for name, h, flags in rotated(variants, r):
                what = f"round {r + 1}: {name}, {h} host{'s' if h > 1 else ''} x 1 rank"
                if name.endswith(" at once"):
                    what = f"round {r + 1}: {name.split()[0]} alone on each of {h} hosts at once"
                    res = self.alone_at_once(list(range(h)), name.split()[0], what)
                elif name == "ddp":
                    res = self.ddp(list(range(h)), what=what)
                else:
                    env = None
                    if name.endswith(" mpi"):
                        env = {"DTRAIN_CPU_OPERATIONS": "mpi"}
                    if name.endswith(" nonblocking"):
                        env = {"DTRAIN_MPI_NONBLOCKING": "1", "DTRAIN_CPU_OPERATIONS": "mpi"}
                        if a.wait_max_sleep_us is not None:
                            env["DTRAIN_WAIT_MAX_SLEEP_US"] = a.wait_max_sleep_us
                    if name.endswith(" gloo"):
                        env = {"DTRAIN_CPU_OPERATIONS": "gloo"}
                    res = self.train(list(range(h)), flags=flags, env=env, what=what)
                log(f"{what}: {res['images_per_second']:.1f} img/s, step "
                    f"{1e3 * res['step_seconds']:.1f} ms")
                runs.append({"variant": name, "hosts": h, "round": r, **res})
        summary = summarize_training(runs, self.hosts)
        self.results["training"] = {"runs": runs, "summary": summary}
        print_training(summary)

    def experiment_hierarchical(self):
        a = self.args
        rate = nc.parse_rate(a.hierarchical_rate) if a.hierarchical_rate else self.rate
        log(f"\n## hierarchical: 2 hosts x 2 ranks, cross-host links at {nc.format_rate(rate)}")
        self.shape(rate, "hierarchical")
        size = a.hierarchical_bytes
        variants = [(kind, hier) for kind in ("allreduce", "training") for hier in (0, 1)]
        runs = []
        for r in range(a.rounds):
            for kind, hier in rotated(variants, r):
                env = {"DTRAIN_HIERARCHICAL_ALLREDUCE": str(hier)}
                what = f"round {r + 1}: {kind}, {'hierarchical' if hier else 'flat'}"
                if kind == "allreduce":
                    t_dtrain, t_raw = self.bandwidth([0, 1], 2, [size], a.bench_rounds, env,
                                                     what)[size]
                    log(f"{what}: dtrain {1e3 * t_dtrain:.1f} ms, raw MPI {1e3 * t_raw:.1f} ms")
                    runs.append({"kind": kind, "hierarchical": hier, "round": r,
                                 "seconds": t_dtrain, "raw_seconds": t_raw})
                else:
                    res = self.train([0, 1], slots=2, env=env, what=what)
                    log(f"{what}: {res['images_per_second']:.1f} img/s")
                    runs.append({"kind": kind, "hierarchical": hier, "round": r, **res})
        summary = summarize_hierarchical(runs)
        self.results["hierarchical"] = {"rate_bps": rate, "bytes": size, "runs": runs,
                                        "summary": summary}
        print_hierarchical(summary, size)

    def autotune_env(self):
        a = self.args
        return {"DTRAIN_AUTOTUNE_STEPS_PER_SAMPLE": str(a.autotune_steps_per_sample),
                "DTRAIN_AUTOTUNE_BAYES_OPT_MAX_SAMPLES": str(a.autotune_configurations)}

    def experiment_autotune(self):
        a = self.args
        log(f"\n## autotune: 2 hosts x 1 rank; {a.autotune_configurations} configurations x 5 "
            f"samples x {a.autotune_steps_per_sample} steps")
        self.shape(self.rate, "autotune")
        out = self.dtrain([0, 1], 1, [self.bench_autotune, f"--model={a.autotune_model}",
                                      f"--rounds={a.rounds_autotune}", "--steps=5"],
                          self.autotune_env(), "bench_autotune_grad_sync",
                          complete=lambda o: "| worst tried |" in o)
        table = [line for line in out.splitlines() if line.startswith("|")]
        for line in out.splitlines():
            if line.startswith(("|", a.autotune_model)):
                log(line)
        bench = {}
        for line in table[2:]:
            cells = [c.strip() for c in line.strip("|").split("|")]
            bench[cells[0]] = {"knobs": cells[1], "median_seconds": parse_time(cells[2]),
                               "vs_default": float(cells[4])}
        # The training run: tune once, then train with each configuration, interleaved.
        steps_needed = ((3 + 5 * a.autotune_configurations) * a.autotune_steps_per_sample
                        + 2 * a.autotune_configurations + 10)
        epochs = max(2, math.ceil(steps_needed / a.steps) + 1)
        log_path = os.path.join(self.scratch, "autotune.csv")
        env = dict(self.autotune_env(), DTRAIN_AUTOTUNE="1", DTRAIN_AUTOTUNE_LOG=log_path)
        tuning = self.train([0, 1], env=env, epochs=epochs,
                            what=f"training with DTRAIN_AUTOTUNE=1 ({epochs} epochs)")
        configs = read_autotune_log(log_path)
        if "choice" not in configs:
            raise Failure(f"the tuner did not settle within {epochs * a.steps} training steps")
        log(f"tuning run: {tuning['images_per_second']:.1f} img/s over its later epochs; "
            f"{len(configs['medians'])} configurations measured")
        chosen = {"default": configs["default"], "tuned": configs["choice"],
                  "worst tried": configs["worst"]}
        for name, knobs in chosen.items():
            log(f"  {name}: {describe_knobs(knobs)}")
        runs = []
        names = list(chosen)
        for r in range(a.rounds):
            for name in rotated(names, r):
                what = f"round {r + 1}: training, {name} configuration"
                res = self.train([0, 1], env=knob_env(chosen[name]), what=what)
                log(f"{what}: {res['images_per_second']:.1f} img/s")
                runs.append({"configuration": name, "round": r, **res})
        summary = {n: median([x["images_per_second"] for x in runs if x["configuration"] == n])
                   for n in names}
        self.results["autotune"] = {"bench": bench, "bench_output": out, "tuning": tuning,
                                    "configurations": chosen, "runs": runs, "summary": summary}
        log("\n| training configuration | knobs | images/s (median) | vs default |")
        log("|---|---|---|---|")
        for n in names:
            log(f"| {n} | {describe_knobs(chosen[n])} | {summary[n]:.1f} | "
                f"{summary[n] / summary['default']:.2f} |")

    def experiment_buckets(self):
        a = self.args
        rhos = [float(x) for x in a.rhos.split(",")]
        log(f"\n## buckets: 2 hosts x 1 rank, links from fast to slow: rho = {rhos}")
        variants = []
        for ops in a.buckets_cpu_operations.split(","):
            if ops not in ("mpi", "gloo"):
                raise Failure(f"--buckets-cpu-operations: '{ops}' is neither mpi nor gloo")
            prefix = "" if ops == "mpi" else "gloo "
            # One bucket per step, named explicitly: the default across hosts is 25 MiB.
            variants += [(f"{prefix}one bucket", ("--bucket-mb", str(ONE_BUCKET_MB)))] + [
                (f"{prefix}--bucket-mb {mb}", ("--bucket-mb", mb))
                for mb in a.bucket_sizes.split(",")]
        if a.buckets_ddp and self.has_torch:
            variants.append(("ddp", ()))
        if variants[0][0] != "one bucket":
            raise Failure("--buckets-cpu-operations: the first must be mpi, whose one bucket per "
                          "step the others are compared with")
        rows = []
        for rho in rhos:
            rate = profiles.rate_for_ratio(rho, self.gradient_bytes, self.compute_s)
            if rate > 0.7 * self.ceiling:
                log(f"rho {rho}: needs {nc.format_rate(rate)}, beyond what a link carries here; "
                    f"left out")
                continue
            self.shape(rate, f"buckets, rho {rho}")
            runs = []
            for r in range(a.rounds):
                for name, flags in rotated(variants, r):
                    what = f"rho {rho}, round {r + 1}: {name}"
                    if name == "ddp":
                        res = self.ddp([0, 1], what=what)
                    else:
                        env = {"DTRAIN_CPU_OPERATIONS": "gloo" if name.startswith("gloo ") else "mpi"}
                        res = self.train([0, 1], flags=flags, env=env, what=what)
                    log(f"{what}: step {1e3 * res['step_seconds']:.1f} ms")
                    runs.append({"variant": name, "round": r, **res})
            steps = {n: median([x["step_seconds"] for x in runs if x["variant"] == n])
                     for n, _ in variants}
            rows.append({"rho": rho, "rate_bps": rate, "step_seconds": steps, "runs": runs})
        self.results["buckets"] = rows
        print_buckets(rows, [n for n, _ in variants])

    # -- the run ---------------------------------------------------------------------------

    def run(self, experiments):
        self.hosts = sorted({int(h) for h in self.args.hosts.split(",")})
        if min(self.hosts) < 2:
            raise Failure("--hosts are multi-host counts (2 or more); 1 host always runs")
        self.max_hosts = max(self.hosts + [2])
        self.check_inputs(experiments)
        self.layout()
        # Named like the cluster's own objects, so a run killed with SIGKILL leaves nothing the
        # next run does not sweep.
        self.scratch = tempfile.mkdtemp(prefix=nc.owner_tag(CLUSTER_PREFIX) + "scratch-")
        try:
            with nc.Cluster(hosts=self.max_hosts, cpus=self.cpus,
                            prefix=CLUSTER_PREFIX) as cluster:
                self.cluster = cluster
                self.calibrate()
                for name in experiments:
                    started = time.monotonic()
                    getattr(self, f"experiment_{name}")()
                    log(f"({name}: {time.monotonic() - started:.0f} s)")
                    self.save()
            left = cluster.leftovers()
            if left:
                raise Failure(f"namespaces left behind: {left}")
        finally:
            shutil.rmtree(self.scratch, ignore_errors=True)
        self.results["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self.save()
        if self.results["notes"]:
            log("\nnot measured or not reproducible here:")
            for text in self.results["notes"]:
                log(f"- {text}")

    def save(self):
        if self.args.output:
            with open(self.args.output, "w") as f:
                json.dump(self.results, f, indent=1, default=str)


# -- analysis and tables -------------------------------------------------------------------

def fit_alpha_beta(table, hosts):
    """t(S) = 2 (n - 1) alpha + k(n) S / beta, the ring allreduce model on n hosts: beta from a
    least-squares line through the sizes of 1 MiB and more (where bandwidth dominates), alpha
    from the smallest size."""
    steps = 2 * (hosts - 1)
    k = profiles.allreduce_factor(hosts)
    large = [(size, t) for size, (t, _) in table.items() if size >= 1 << 20]
    if len(large) < 2:
        large = [(size, table[size][0]) for size in sorted(table)[-2:]]
    mean_s = sum(s for s, _ in large) / len(large)
    mean_t = sum(t for _, t in large) / len(large)
    slope = (sum((s - mean_s) * (t - mean_t) for s, t in large)
             / sum((s - mean_s) ** 2 for s, _ in large))
    beta = k / max(slope, 1e-15)
    small = min(table)
    alpha = max(0.0, (table[small][0] - k * small / beta) / steps)
    return {"alpha_s": alpha, "beta_bytes_per_s": beta, "hosts": hosts}


def summarize_training(runs, hosts):
    def ips(variant, h):
        return [x["images_per_second"] for x in runs if x["variant"] == variant
                and x["hosts"] == h]
    rows = []
    base = {"dtrain": median(ips("dtrain", 1)), "ddp": median(ips("ddp", 1))}
    for h in [1] + hosts:
        at_once = {t: median(ips(f"{t} at once", h)) for t in ("dtrain", "ddp")}
        for variant in ("dtrain at once", "ddp at once", "dtrain", "dtrain mpi", "dtrain buckets",
                        "dtrain nonblocking", "dtrain buckets nonblocking", "dtrain gloo",
                        "dtrain buckets gloo", "dtrain fp16", "dtrain powersgd", "dtrain adasum",
                        "dtrain shard optimizer", "dtrain shard gradients", "ddp"):
            values = ips(variant, h)
            if not values:
                continue
            trainer = "ddp" if variant.startswith("ddp") else "dtrain"
            single = base[trainer]
            m = median(values)
            row = {"variant": variant, "hosts": h, "images_per_second": m,
                   "best": max(values), "runs": len(values)}
            payload = [x["payload_mb_per_step"] for x in runs if x["variant"] == variant
                       and x["hosts"] == h and x.get("payload_mb_per_step") is not None]
            if payload:
                row["payload_mb_per_step"] = median(payload)
            if variant.endswith(" at once"):
                # images/s of one job; how much the neighbours slow each host's compute
                row["vs_alone"] = m / single if single else None
            else:
                row["scaling_efficiency"] = m / (h * single) if single else None
                contended = at_once[trainer]
                row["efficiency_vs_at_once"] = (m / (h * contended)
                                                if h > 1 and contended == contended else None)
            rows.append(row)
    for row in rows:
        ddp = [r for r in rows if r["variant"] == "ddp" and r["hosts"] == row["hosts"]]
        row["step_vs_ddp"] = (ddp[0]["images_per_second"] / row["images_per_second"]
                              if ddp and not row["variant"].endswith(" at once") else None)
    return rows


def print_training(rows):
    log("\n| trainer | hosts x ranks | images/s (median) | best | scaling efficiency | "
        "efficiency vs alone at once | step / DDP's step | payload MB/step | runs |")
    log("|---|---|---|---|---|---|---|---|---|")
    names = {"dtrain": "dtrain (CPU defaults across hosts: Gloo, 25 MiB buckets)",
             "dtrain mpi": "dtrain over MPI (DTRAIN_CPU_OPERATIONS=mpi), 25 MiB buckets",
             "dtrain buckets": "dtrain, buckets overlapping backward",
             "dtrain nonblocking": "dtrain, one bucket, nonblocking allreduce (DTRAIN_MPI_NONBLOCKING=1)",
             "dtrain buckets nonblocking": "dtrain, buckets, nonblocking allreduce",
             "dtrain gloo": "dtrain, one bucket, over Gloo (DTRAIN_CPU_OPERATIONS=gloo)",
             "dtrain buckets gloo": "dtrain, buckets, over Gloo",
             "dtrain fp16": "dtrain, fp16 compression",
             "dtrain powersgd": "dtrain, PowerSGD compression (--compression powersgd)",
             "dtrain adasum": "dtrain, Adasum (--op adasum)", "ddp": "PyTorch DDP (gloo)",
             "dtrain shard optimizer": "dtrain, sharded optimizer state (--shard optimizer)",
             "dtrain shard gradients": "dtrain, sharded state and gradients (--shard gradients)",
             "dtrain at once": "dtrain trainer alone on each host at once (per job)",
             "ddp at once": "PyTorch alone on each host at once (per job)"}

    def cell(value):
        return f"{value:.2f}" if value else ""
    for r in rows:
        if r["hosts"] == 1:
            name = "dtrain C++ trainer alone" if r["variant"] == "dtrain" else "PyTorch alone"
        else:
            name = names[r["variant"]]
        if r["variant"].endswith(" at once"):
            eff = f"{cell(r['vs_alone'])} x alone"
            log(f"| {name} | {r['hosts']} x (1 x 1) | {r['images_per_second']:.1f} | "
                f"{r['best']:.1f} | {eff} | | | | {r['runs']} |")
            continue
        vs = cell(r["step_vs_ddp"]) if r["variant"] != "ddp" else ""
        log(f"| {name} | {r['hosts']} x 1 | {r['images_per_second']:.1f} | {r['best']:.1f} | "
            f"{cell(r['scaling_efficiency'])} | {cell(r.get('efficiency_vs_at_once'))} | {vs} | "
            f"{cell(r.get('payload_mb_per_step'))} | {r['runs']} |")
    log("scaling efficiency: images/s on H hosts / (H x images/s of the same trainer alone); "
        "efficiency vs alone at once: the same over H single-rank jobs running at the same time "
        "(the hosts share this machine's caches and memory bandwidth: what communication alone "
        "costs); step / DDP's step below 1: dtrain faster (on 1 x 1: the C++ trainer's step "
        "over PyTorch's)")


def summarize_hierarchical(runs):
    out = {}
    for kind, key in (("allreduce", "seconds"), ("training", "images_per_second")):
        for hier in (0, 1):
            values = [x[key] for x in runs if x["kind"] == kind and x["hierarchical"] == hier]
            out[f"{kind}_{hier}"] = median(values)
        if kind == "allreduce":
            out["raw"] = median([x["raw_seconds"] for x in runs if x["kind"] == kind])
    return out


def print_hierarchical(s, size):
    log("\n| measure | flat | hierarchical | hierarchical / flat | raw MPI (flat) |")
    log("|---|---|---|---|---|")
    log(f"| {size >> 20} MiB allreduce, median time | {1e3 * s['allreduce_0']:.1f} ms | "
        f"{1e3 * s['allreduce_1']:.1f} ms | {s['allreduce_1'] / s['allreduce_0']:.2f} | "
        f"{1e3 * s['raw']:.1f} ms |")
    log(f"| training, images/s (median) | {s['training_0']:.1f} | {s['training_1']:.1f} | "
        f"{s['training_1'] / s['training_0']:.2f} | |")
    log("bandwidth-bound expectation: a flat ring of 4 ranks (2 per host) sends 1.5x the "
        "tensor's bytes through each host's link, hierarchical 1.0x: time ratio 0.67")


def print_buckets(rows, names):
    log("\n| rho (2 hosts) | link | " + " | ".join(f"{n} step" for n in names)
        + " | best overlap / one bucket |")
    log("|---|---|" + "---|" * len(names) + "---|")
    pays = None
    for row in rows:
        steps = row["step_seconds"]
        best = min(steps[n] for n in names[1:] if n != "ddp")  # dtrain's own ways
        ratio = best / steps[names[0]]
        row["best_over_one_bucket"] = ratio
        if pays is None and ratio < 0.95:
            pays = row["rho"]
        log(f"| {row['rho']:g} | {nc.format_rate(row['rate_bps'])} | "
            + " | ".join(f"{1e3 * steps[n]:.1f} ms" for n in names) + f" | {ratio:.2f} |")
    if pays is None:
        log("overlap (some bucket size) is not 5% faster than one bucket per step at any rho "
            "measured")
    else:
        log(f"overlap is first 5% or more faster than one bucket per step at rho = {pays:g}")


def read_autotune_log(path):
    """default (configuration 0), choice, worst (lowest median) knobs from DTRAIN_AUTOTUNE_LOG."""
    knobs = ("fusion_threshold_bytes", "cycle_time_ms", "hierarchical_allreduce",
             "response_cache", "fusion_pipeline", "mpi_pieces_in_flight")
    out = {"medians": {}}
    if not os.path.exists(path):
        return out
    with open(path) as f:
        for row in csv.DictReader(f):
            k = {n: row[n] for n in knobs}
            if row["kind"] == "median":
                out["medians"][row["configuration"]] = (float(row["score_bytes_per_second"]), k)
                if row["configuration"] == "0":
                    out["default"] = k
            elif row["kind"] == "choice":
                out["choice"] = k
    if out["medians"]:
        out["worst"] = min(out["medians"].values(), key=lambda v: v[0])[1]
    return out


def knob_env(k):
    return {"DTRAIN_FUSION_THRESHOLD": k["fusion_threshold_bytes"],
            "DTRAIN_CYCLE_TIME": k["cycle_time_ms"],
            "DTRAIN_HIERARCHICAL_ALLREDUCE": k["hierarchical_allreduce"],
            "DTRAIN_CACHE_CAPACITY": "1024" if k["response_cache"] == "1" else "0",
            "DTRAIN_FUSION_PIPELINE": k["fusion_pipeline"],
            "DTRAIN_MPI_PIECES_IN_FLIGHT": k["mpi_pieces_in_flight"]}


def describe_knobs(k):
    mib = int(k["fusion_threshold_bytes"]) / (1 << 20)
    cache = "on" if k["response_cache"] == "1" else "off"
    pipeline = "on" if k["fusion_pipeline"] == "1" else "off"
    return (f"{mib:.4g} MiB, {k['cycle_time_ms']} ms, cache {cache}, pipeline {pipeline}, "
            f"{k['mpi_pieces_in_flight']} in flight"
            + (", hierarchical" if k["hierarchical_allreduce"] == "1" else ""))


def machine_info():
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f
                        if line.startswith("model name")), "")
    except OSError:
        pass
    return {"cpus": os.cpu_count(), "cpu": cpu, "kernel": platform.release(),
            "load_average": os.getloadavg()}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    p.add_argument("--build-dir", default=os.environ.get("DTRAIN_BUILD_DIR"),
                   help="build tree with dtrainrun, resnet_train and the benchmarks "
                        "(default: $DTRAIN_BUILD_DIR)")
    p.add_argument("--python", help="interpreter with torch, for PyTorch DDP")
    p.add_argument("--all", action="store_true", help="every experiment")
    p.add_argument("--experiment", default="", help=f"comma-separated: {', '.join(EXPERIMENTS)}")
    p.add_argument("--profile", default="v100-25gbe", choices=sorted(profiles.TARGETS),
                   help="the cluster the links stand for (profiles.py)")
    p.add_argument("--link-rate", help="a fixed link rate instead of a profile, e.g. 400mbit")
    p.add_argument("--qdisc", default="tbf", choices=nc.QDISCS)
    p.add_argument("--hosts", default="2,3", help="host counts of the training experiment")
    p.add_argument("--model", default="resnet50")
    p.add_argument("--image-size", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=16, help="per rank")
    p.add_argument("--epochs", type=int, default=3, help="per run; the first is not counted")
    p.add_argument("--steps", type=int, default=8, help="steps per epoch")
    p.add_argument("--threads", type=int, default=0,
                   help="intra-op threads per rank (default: the host's cores / its ranks)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds per experiment")
    p.add_argument("--bucket-mb", default="25", help="the training experiment's bucket size")
    p.add_argument("--powersgd-rank", type=int, default=2,
                   help="the rank of the training experiment's 'dtrain powersgd' variant")
    p.add_argument("--training-variants", default="",
                   help="comma-separated variants of the training experiment on several hosts "
                        "(default: all), e.g. 'dtrain,dtrain gloo,ddp'")
    p.add_argument("--bucket-sizes", default="0,4,25",
                   help="--bucket-mb values of the buckets experiment")
    p.add_argument("--buckets-cpu-operations", default="mpi",
                   help="host backends of the buckets experiment, e.g. 'mpi,gloo' "
                        "(DTRAIN_CPU_OPERATIONS; mpi first)")
    p.add_argument("--buckets-ddp", action="store_true",
                   help="PyTorch DDP beside the buckets experiment's variants")
    p.add_argument("--rhos", default="0.1,0.3,1,3",
                   help="comm/compute ratios of the buckets experiment's links")
    p.add_argument("--hierarchical-rate", help="link rate of the hierarchical experiment "
                                               "(default: the profile's)")
    p.add_argument("--hierarchical-bytes", type=int, default=16 << 20)
    p.add_argument("--wait-mb", type=int, default=64, help="the wait experiment's allreduce")
    p.add_argument("--wait-rates", default="400mbit,profile",
                   help="link rates of the wait experiment ('profile': the profile's)")
    p.add_argument("--wait-caps", default="0,100,500,2000,20000",
                   help="DTRAIN_WAIT_MAX_SLEEP_US values the wait experiment compares")
    p.add_argument("--wait-max-sleep-us", default=None,
                   help="DTRAIN_WAIT_MAX_SLEEP_US of the training experiment's nonblocking "
                        "variants (default: dtrain's)")
    p.add_argument("--link-max-bytes", type=int, default=16 << 20,
                   help="largest allreduce of the link experiment (from 4 KiB up, x4)")
    p.add_argument("--bench-rounds", type=int, default=5, help="rounds inside each benchmark")
    p.add_argument("--autotune-model", default="resnet18", choices=["resnet18", "resnet50"])
    p.add_argument("--rounds-autotune", type=int, default=3,
                   help="bench_autotune_grad_sync --rounds")
    p.add_argument("--autotune-steps-per-sample", type=int, default=3)
    p.add_argument("--autotune-configurations", type=int, default=12)
    p.add_argument("--probe-seconds", type=float, default=1.0,
                   help="length of each link measurement")
    p.add_argument("--job-timeout", type=float, default=1800, help="seconds per job")
    p.add_argument("--output", default="cluster_results.json",
                   help="JSON with every measurement (input of scaling_model.py)")
    p.add_argument("--quick", action="store_true",
                   help="a smoke run of every step in a few minutes: 1 round, 2 hosts, short "
                        "runs; its numbers mean nothing")
    args = p.parse_args()
    if not args.build_dir:
        p.error("--build-dir (or DTRAIN_BUILD_DIR) is needed")
    if args.quick:
        args.rounds, args.hosts, args.epochs, args.steps = 1, "2", 2, 2
        args.bench_rounds, args.rounds_autotune = 1, 1
        args.autotune_steps_per_sample, args.autotune_configurations = 1, 3
        args.rhos, args.bucket_sizes, args.probe_seconds = "0.5", "0", 0.5
        args.wait_mb, args.wait_rates, args.wait_caps = 8, "400mbit", "0,500"
    experiments = list(EXPERIMENTS) if args.all else [
        e for e in args.experiment.split(",") if e]
    unknown = [e for e in experiments if e not in EXPERIMENTS]
    if unknown or not experiments:
        p.error(f"--experiment takes {', '.join(EXPERIMENTS)} (or --all); got {unknown or '-'}")
    if args.epochs < 2:
        p.error("--epochs must be 2 or more: the first epoch is warm-up and not counted")
    reason = nc.namespaces_unavailable() or nc.shaping_unavailable(args.qdisc)
    if reason:
        log(f"cannot stand up a cluster here: {reason}")
        return nc.SKIPPED
    nc.install_signal_handlers()
    harness = Harness(args)
    log(f"# {harness.results['started']}, {os.cpu_count()} CPUs, "
        f"{harness.results['machine']['cpu']}, load average "
        f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    try:
        harness.run(experiments)
    except (Failure, nc.ClusterError) as e:
        log(f"FAILED: {e}")
        harness.results["failure"] = str(e)
        harness.save()
        return 1
    except KeyboardInterrupt as e:
        log(f"interrupted ({e or 'Ctrl-C'}); the cluster is torn down")
        harness.save()
        return 130
    log(f"# load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
