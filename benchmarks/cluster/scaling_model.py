#!/usr/bin/env python3
"""An alpha-beta model of data-parallel scaling, calibrated on the namespaced cluster, applied
to a real cluster's network and GPUs (docs/scaling.md).

    python3 benchmarks/cluster/scaling_model.py --results cluster_results.json
    python3 benchmarks/cluster/scaling_model.py --target horovod-resnet101 --results ...

One step on N GPUs (M = N / gpus_per_host servers, one NIC each) takes

    T(N)      = T_comp + max(0, T_comm(M) - phi * T_comp)
    T_comm(M) = k(M) * G / (eta * L) + 2 (M - 1) * alpha * messages,   k(M) = 2 (M - 1) / M

and the scaling efficiency is T_comp / T(N). From the target (profiles.py): G, L, T_comp and
gpus_per_host. From the measurements (run_experiments.py's JSON):
  alpha  seconds per message per ring step: the 'link' experiment's small allreduce, across
         two namespaced hosts (MPI over TCP on a veth: software latency, no wire latency);
  eta    the share of the link rate an allreduce achieves: its fitted beta / the link's rate;
  phi    how much of a step's compute the allreduce hides behind: from the 'training'
         experiment, hidden = T_comm predicted for H hosts - (step(H) - step(1)), as a share of
         the compute time, for the dtrain variant named by --variant (the compute time of
         single-rank jobs on every host at once, where measured: the hosts share caches and
         memory bandwidth).
messages: allreduce calls per step, ceil(G / fusion buffer), 64 MiB being Horovod's default.

What it leaves out: the reduction inside a server (NVLink/PCIe taken as free, so 1 server = no
communication); the wire's and the switches' latency (the shaped links have none: netem is not
available) and so any growth of alpha with the fabric's size; switch oversubscription and
congestion between rings; stragglers and jitter, which grow with N; tree or hierarchical
algorithms; the coordinator's negotiation, whose cost grows with N; GPU contention between
compute and communication kernels; data loading; and phi and eta being measured on CPUs at a
local rate, then assumed to carry over to GPUs and the target's rate.
"""
import argparse
import json
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import profiles  # noqa: E402

GPU_COUNTS = (8, 16, 32, 64, 128, 256, 512)
HOROVOD_FUSION_BYTES = 64 << 20


def step_time(target, gpus, alpha_s, eta, phi, fusion_bytes=HOROVOD_FUSION_BYTES):
    servers = max(1, math.ceil(gpus / target.gpus_per_host))
    if servers == 1:
        return target.compute_seconds, 0.0
    messages = max(1, math.ceil(target.gradient_bytes / fusion_bytes))
    comm = (profiles.allreduce_factor(servers) * target.gradient_bytes * 8
            / (eta * target.link_bps) + 2 * (servers - 1) * alpha_s * messages)
    exposed = max(0.0, comm - phi * target.compute_seconds)
    return target.compute_seconds + exposed, comm


def calibrate(results, variant):
    """alpha, eta, phi from run_experiments.py's JSON; raises KeyError where one is missing."""
    fit = results["alpha_beta"]
    alpha = fit["alpha_s"]
    eta = fit["beta_bytes_per_s"] * 8 / fit["link_bps"]
    cal = results["calibration"]
    compute, grad = cal["compute_seconds"], cal["gradient_bytes"]
    rows = results["training"]["summary"]
    alone = next(r for r in rows if r["variant"] == "dtrain" and r["hosts"] == 1)
    batch = results["args"]["batch_size"]
    phis = {}
    for r in rows:
        if r["variant"] != variant or r["hosts"] < 2:
            continue
        h = r["hosts"]
        step_h = h * batch / r["images_per_second"]
        # The compute baseline with the same neighbours where it was measured: the hosts share
        # the machine's caches and memory bandwidth (run_experiments.py, alone_at_once).
        at_once = next((x for x in rows if x["variant"] == "dtrain at once"
                        and x["hosts"] == h), None)
        step_1 = batch / (at_once or alone)["images_per_second"]
        comm = (profiles.allreduce_factor(h) * grad / fit["beta_bytes_per_s"]
                + 2 * (h - 1) * alpha)
        # Hidden: what the allreduce would have added minus what it did add, at most all of it
        # (a noisy run can add less than nothing).
        phis[h] = min(comm, max(0.0, comm - (step_h - step_1))) / compute
    if not phis:
        raise KeyError(f"no multi-host runs of variant {variant!r}")
    return alpha, eta, min(phis.values()), phis


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    p.add_argument("--target", default="v100-25gbe", choices=sorted(profiles.TARGETS))
    p.add_argument("--results", help="run_experiments.py's JSON output")
    p.add_argument("--variant", default="dtrain buckets",
                   help="the training experiment's dtrain variant that phi is taken from")
    p.add_argument("--alpha-us", type=float, help="instead of the measured alpha")
    p.add_argument("--eta", type=float, help="instead of the measured link efficiency")
    p.add_argument("--phi", type=float, help="instead of the measured overlap")
    p.add_argument("--fusion-mb", type=float, default=HOROVOD_FUSION_BYTES / (1 << 20))
    args = p.parse_args()
    target = profiles.TARGETS[args.target]

    alpha = eta = phi = None
    source = "given on the command line"
    if args.results:
        with open(args.results) as f:
            results = json.load(f)
        try:
            alpha, eta, phi, phis = calibrate(results, args.variant)
            source = (f"calibrated from {args.results}: phi per host count "
                      + ", ".join(f"{h}: {v:.2f}" for h, v in sorted(phis.items()))
                      + " (the smallest is used)")
        except KeyError as e:
            sys.exit(f"{args.results} lacks what the model needs ({e}); run the link and "
                     f"training experiments")
    alpha = args.alpha_us * 1e-6 if args.alpha_us is not None else alpha
    eta = args.eta if args.eta is not None else eta
    phi = args.phi if args.phi is not None else phi
    if None in (alpha, eta, phi):
        sys.exit("need --results, or all of --alpha-us, --eta and --phi")

    fusion = int(args.fusion_mb * (1 << 20))
    print(f"target {target.key}: {target.description}")
    print(f"  G = {target.gradient_bytes / 1e6:.1f} MB, L = {target.link_bps / 1e9:g} Gbit/s, "
          f"T_comp = {1e3 * target.compute_seconds:.1f} ms, {target.gpus_per_host} GPUs per "
          f"server; {target.source}")
    print(f"  alpha = {1e6 * alpha:.1f} us, eta = {eta:.2f}, phi = {phi:.2f} ({source})")
    print()
    print("| GPUs | servers | T_comm | predicted efficiency | bandwidth only, no overlap "
          "(eta 1, alpha 0, phi 0) |")
    print("|---|---|---|---|---|")
    for n in GPU_COUNTS:
        step, comm = step_time(target, n, alpha, eta, phi, fusion)
        bound, _ = step_time(target, n, 0.0, 1.0, 0.0, fusion)
        print(f"| {n} | {max(1, math.ceil(n / target.gpus_per_host))} | {1e3 * comm:.1f} ms | "
              f"{target.compute_seconds / step:.2f} | {target.compute_seconds / bound:.2f} |")
    published = target.published_efficiency or profiles.TARGETS[
        "horovod-resnet101"].published_efficiency
    print()
    print(f"Horovod's published figure: {published}"
          + ("" if target.published_efficiency else
             " -- on P100s with ResNet-101 and Inception V3, not this target"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
