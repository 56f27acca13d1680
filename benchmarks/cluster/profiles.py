"""Link profiles: the rate a local link needs to stand for a real cluster's network.

A profile is chosen by similarity, not by guess. What makes a data-parallel job scale or not is
the ratio of the time a step spends moving gradients to the time it spends computing:

    rho = T_comm / T_comp,   T_comm = k(N) * G / L,   k(N) = 2 (N - 1) / N

for a ring allreduce of G gradient bytes per step over links of L bytes/s among N hosts (each
host sends and receives k(N) * G bytes). A local cluster reproduces the target's behaviour when
its rho is the target's rho at the same N. k(N) is the same on both sides and cancels:

    L_local = L_target * (G_local / G_target) * (T_comp_target / T_comp_local)

T_comp_local is measured on this machine (one rank alone, the same model, batch and threads the
experiments use), so the same profile gives a faster link on a faster machine.

What this keeps and what it does not:
- Bandwidth only. The shaped links add no latency (tc netem is not available on the kernels the
  harness was written for), so the per-message cost alpha of the target network is not
  reproduced; the local alpha is that of a veth (tens of microseconds through MPI/TCP).
- One local host stands for one target server and its network. Servers with several GPUs
  reduce inside the server over NVLink/PCIe first (or run one ring through all GPUs); either
  way the server's network carries about k(N) * G per step, so gpus_per_host changes the
  latency term only. A server with one NIC per GPU counts as one link of their summed rate.
- The target's T_comp comes from a published single-GPU throughput (images/s, no
  communication) and the per-GPU batch of its benchmark: T_comp = batch / throughput.
"""
from dataclasses import dataclass

GBIT = 1e9
# Parameter counts of the torchvision models (float32 gradients: 4 bytes each). The local
# trainer's own count comes from its "model: ..., N parameters" line.
RESNET50_PARAMETERS = 25_557_032
RESNET101_PARAMETERS = 44_549_160


@dataclass(frozen=True)
class Target:
    key: str
    description: str
    model: str
    gradient_bytes: float      # per step, float32 gradients
    link_bps: float            # one server's NIC, bits/s
    images_per_second: float   # one GPU, no communication
    batch_per_gpu: int
    gpus_per_host: int
    source: str
    published_efficiency: str = ""  # the target's own published scaling, where there is one

    @property
    def compute_seconds(self):
        return self.batch_per_gpu / self.images_per_second


TARGETS = {t.key: t for t in [
    Target(
        key="v100-25gbe",
        description="ResNet-50 on V100s, 4 per server, 25 Gbit/s Ethernet per server (the "
                    "layout of Horovod's published benchmark)",
        model="resnet50", gradient_bytes=4 * RESNET50_PARAMETERS, link_bps=25 * GBIT,
        images_per_second=367, batch_per_gpu=64, gpus_per_host=4,
        source="367 img/s: NVIDIA DeepLearningExamples, PyTorch ResNet-50 v1.5, FP32, 1x V100 "
               "16GB (DGX-1); its batch was larger than 64, so the step at batch 64 is an "
               "estimate (throughput per image is near flat above 64 on a V100)"),
    Target(
        key="p100-25gbe",
        description="ResNet-50 on P100s, 25 Gbit/s RoCE per server: the hardware of Horovod's "
                    "published benchmark",
        model="resnet50", gradient_bytes=4 * RESNET50_PARAMETERS, link_bps=25 * GBIT,
        images_per_second=219, batch_per_gpu=64, gpus_per_host=4,
        source="219 img/s: TensorFlow's published benchmarks (tf_cnn_benchmarks, DGX-1, 1x "
               "P100, synthetic data, batch 64); network: Horovod's benchmark (128 servers x "
               "4 Pascal GPUs, RoCE 25 Gbit/s)"),
    Target(
        key="horovod-resnet101",
        description="ResNet-101 on P100s, 25 Gbit/s RoCE: Horovod's published benchmark",
        model="resnet101", gradient_bytes=4 * RESNET101_PARAMETERS, link_bps=25 * GBIT,
        images_per_second=125, batch_per_gpu=64, gpus_per_host=4,
        source="125 img/s is an ESTIMATE: no single-P100 ResNet-101 figure is published beside "
               "Horovod's; TensorFlow's P100 table has ResNet-50 219 and ResNet-152 91.8 img/s, "
               "and 125 lies between them in proportion to the models' FLOPs",
        published_efficiency="90% at 512 GPUs (Horovod README: ResNet-101 and Inception V3; "
                             "68% for VGG-16)"),
    Target(
        key="h100-400gib",
        description="ResNet-50 on H100s, 8 per server, one 400 Gbit/s InfiniBand NIC per GPU",
        model="resnet50", gradient_bytes=4 * RESNET50_PARAMETERS, link_bps=8 * 400 * GBIT,
        images_per_second=5000, batch_per_gpu=256, gpus_per_host=8,
        source="5000 img/s is an ESTIMATE: NVIDIA DeepLearningExamples publishes 2470 img/s "
               "for 1x A100 80GB (mixed precision) and vendors report about 2x for vision "
               "models on H100; the server's 8 NICs count as one 3.2 Tbit/s link because each "
               "GPU's NIC carries its 1/8 of the gradients after the reduction inside the "
               "server"),
]}


def allreduce_factor(hosts):
    """Bytes each host sends (and receives) per gradient byte in a ring allreduce."""
    return 2.0 * (hosts - 1) / hosts


def comm_compute_ratio(gradient_bytes, link_bps, compute_seconds, hosts=2):
    """rho: a step's bandwidth-bound allreduce time over its compute time."""
    return allreduce_factor(hosts) * gradient_bytes * 8 / link_bps / compute_seconds


def local_link_rate(gradient_bytes, target_link_bps, target_compute_seconds,
                    local_compute_seconds, local_gradient_bytes=None):
    """The local link rate (bits/s) that gives this machine the target's comm/compute ratio.

    gradient_bytes: the target's gradient bytes per step; local_gradient_bytes: the local
    model's (default: the same model). target_compute_seconds: the target's compute time per
    step; local_compute_seconds: measured here.
    """
    if min(gradient_bytes, target_link_bps, target_compute_seconds,
           local_compute_seconds) <= 0:
        raise ValueError("every input must be positive")
    local_bytes = gradient_bytes if local_gradient_bytes is None else local_gradient_bytes
    return (target_link_bps * (local_bytes / gradient_bytes)
            * (target_compute_seconds / local_compute_seconds))


def rate_for_ratio(rho, gradient_bytes, compute_seconds, hosts=2):
    """The link rate (bits/s) at which a step's allreduce takes rho times its compute."""
    return allreduce_factor(hosts) * gradient_bytes * 8 / (rho * compute_seconds)


def describe(target, local_compute_seconds, local_gradient_bytes):
    """The profile's arithmetic, line by line, and the local rate it gives."""
    rate = local_link_rate(target.gradient_bytes, target.link_bps, target.compute_seconds,
                           local_compute_seconds, local_gradient_bytes)
    rho = comm_compute_ratio(target.gradient_bytes, target.link_bps, target.compute_seconds)
    lines = [
        f"profile {target.key}: {target.description}",
        f"  target: {target.model}, G = {target.gradient_bytes / 1e6:.1f} MB per step, "
        f"L = {target.link_bps / GBIT:g} Gbit/s, T_comp = {target.batch_per_gpu} / "
        f"{target.images_per_second:g} img/s = {1e3 * target.compute_seconds:.1f} ms "
        f"({target.source})",
        f"  target rho at 2 hosts = k(2) G / L / T_comp = {rho:.3f}",
        f"  here: G = {local_gradient_bytes / 1e6:.1f} MB per step, T_comp = "
        f"{1e3 * local_compute_seconds:.1f} ms (measured, one rank alone)",
        f"  L_local = {target.link_bps / GBIT:g} Gbit/s x ({local_gradient_bytes / 1e6:.1f} / "
        f"{target.gradient_bytes / 1e6:.1f}) x ({1e3 * target.compute_seconds:.1f} / "
        f"{1e3 * local_compute_seconds:.1f}) = {rate / 1e6:.1f} Mbit/s",
    ]
    return rate, lines
