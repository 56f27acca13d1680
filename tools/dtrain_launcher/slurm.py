"""SLURM allocations: the compressed node and task lists SLURM puts in the environment of a batch
script (sbatch) or an interactive allocation (salloc), and what dtrainrun does in a job (Note
[dtrainrun in a SLURM job])."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import List, Mapping, Optional

from .errors import UsageError, shown
from .hosts import Host, check_host_name
from .limits import MAX_RANKS, MAX_RANKS_WHY, parse_count

# Node numbers in a node list: SLURM's own are 32-bit; this leaves room and keeps int() cheap.
_MAX_NODE_NUMBER = 10 ** 18


def _split_top_level(text: str, where: str) -> List[str]:
    """Splits at commas outside brackets: 'a[1,3],b' -> ['a[1,3]', 'b']."""
    parts, depth, start = [], 0, 0
    for i, c in enumerate(text):
        if c == "[":
            depth += 1
            if depth > 1:
                raise UsageError(f"dtrain: {where}: nested '[' in {shown(text)}")
        elif c == "]":
            depth -= 1
            if depth < 0:
                raise UsageError(f"dtrain: {where}: ']' without '[' in {shown(text)}")
        elif c == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth != 0:
        raise UsageError(f"dtrain: {where}: '[' without ']' in {shown(text)}")
    parts.append(text[start:])
    return parts


def _too_many_nodes(where: str, text: str, count: int) -> UsageError:
    return UsageError(f"dtrain: {where}: {shown(text)} names {count} or more nodes; at most "
                      f"{MAX_RANKS} ({MAX_RANKS_WHY}, each on a node)")


def _expand_range_list(body: str, item: str, where: str) -> List[str]:
    """'01-03,7' -> ['01', '02', '03', '7']; a range keeps the zero padding of its first bound."""
    bounds = []
    for piece in body.split(","):
        m = re.fullmatch(r"([0-9]+)(?:-([0-9]+))?", piece)
        if not m:
            raise UsageError(f"dtrain: {where}: {shown('[' + body + ']')} in {shown(item)} is not "
                             f"a list of numbers and ranges like 01-04")
        low_text, high_text = m.group(1), m.group(2) or m.group(1)
        low, high = (parse_count(t, _MAX_NODE_NUMBER) for t in (low_text, high_text))
        if high > _MAX_NODE_NUMBER:
            raise UsageError(f"dtrain: {where}: {shown(piece)} in {shown(item)}: node numbers go "
                             f"up to {_MAX_NODE_NUMBER}")
        if high < low:
            raise UsageError(f"dtrain: {where}: range {shown(piece)} in {shown(item)} runs "
                             f"backwards")
        bounds.append((low, high, len(low_text)))
    count = sum(high - low + 1 for low, high, _ in bounds)
    if count > MAX_RANKS:
        raise _too_many_nodes(where, item, count)
    return [str(n).zfill(width) for low, high, width in bounds for n in range(low, high + 1)]


def expand_nodelist(text: str, where: str = "SLURM_JOB_NODELIST") -> List[str]:
    """'node[01-04,07],gpu-a[1-2]' -> node01 ... node04, node07, gpu-a1, gpu-a2. A name may hold
    several bracket groups (rack[1-2]-n[1-2]); they expand as a product, leftmost slowest."""
    text = text.strip()
    if not text:
        raise UsageError(f"dtrain: {where} is empty")
    names: List[str] = []
    for item in _split_top_level(text, where):
        if not item:
            raise UsageError(f"dtrain: {where}: empty entry in {shown(text)}")
        groups = []
        for m in re.finditer(r"([^\[]*)(?:\[([^\]]*)\])?", item):
            literal, body = m.group(1), m.group(2)
            if literal == "" and body is None:
                continue
            groups.append((literal, [""] if body is None else
                           _expand_range_list(body, item, where)))
        product = 1
        for _, options in groups:
            product *= len(options)
            if len(names) + product > MAX_RANKS:
                raise _too_many_nodes(where, text, len(names) + product)
        expanded = [""]
        for literal, options in groups:
            expanded = [prefix + literal + o for prefix in expanded for o in options]
        for name in expanded:
            check_host_name(name, where)
        names.extend(expanded)
    return names


def expand_tasks_per_node(text: str, where: str = "SLURM_TASKS_PER_NODE") -> List[int]:
    """'2(x3),1' -> [2, 2, 2, 1]."""
    counts: List[int] = []
    for piece in text.strip().split(","):
        m = re.fullmatch(r"([0-9]+)(?:\(x([0-9]+)\))?", piece.strip())
        if not m:
            raise UsageError(f"dtrain: {where}={shown(text)}: {shown(piece)} is not N or N(xR)")
        count = parse_count(m.group(1), MAX_RANKS)
        repeat = parse_count(m.group(2) or "1", MAX_RANKS)
        if count < 1 or repeat < 1:
            raise UsageError(f"dtrain: {where}={shown(text)}: {shown(piece)} gives a node no "
                             f"tasks")
        if count > MAX_RANKS:
            raise UsageError(f"dtrain: {where}={shown(text)}: {shown(piece)} gives a node more "
                             f"than {MAX_RANKS} tasks ({MAX_RANKS_WHY})")
        if len(counts) + repeat > MAX_RANKS:
            raise UsageError(f"dtrain: {where}={shown(text)}: more than {MAX_RANKS} task counts "
                             f"({MAX_RANKS_WHY}, each on a node)")
        counts.extend([count] * repeat)
    return counts


def in_allocation(env: Mapping[str, str]) -> bool:
    return bool(env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST"))


def hosts_from_env(env: Mapping[str, str]) -> Optional[List[Host]]:
    """The allocation's nodes with their task counts as slots, or None outside an allocation.
    Task counts come from SLURM_TASKS_PER_NODE (the allocation's real layout), else
    SLURM_NTASKS_PER_NODE (--ntasks-per-node), else one per node."""
    nodelist_var = "SLURM_JOB_NODELIST" if env.get("SLURM_JOB_NODELIST") else "SLURM_NODELIST"
    nodelist = env.get(nodelist_var)
    if not nodelist:
        return None
    nodes = expand_nodelist(nodelist, nodelist_var)
    if env.get("SLURM_TASKS_PER_NODE"):
        counts = expand_tasks_per_node(env["SLURM_TASKS_PER_NODE"])
        if len(counts) != len(nodes):
            raise UsageError(
                f"dtrain: SLURM_TASKS_PER_NODE={shown(env['SLURM_TASKS_PER_NODE'])} gives "
                f"{len(counts)} task counts but {nodelist_var}={shown(nodelist)} has {len(nodes)} "
                f"nodes")
    elif env.get("SLURM_NTASKS_PER_NODE"):
        counts = expand_tasks_per_node(env["SLURM_NTASKS_PER_NODE"], "SLURM_NTASKS_PER_NODE")
        if len(counts) != 1:
            raise UsageError(f"dtrain: SLURM_NTASKS_PER_NODE={shown(env['SLURM_NTASKS_PER_NODE'])} "
                             f"is not one number")
        counts = counts * len(nodes)
    else:
        counts = [1] * len(nodes)
    if len(set(nodes)) != len(nodes):
        raise UsageError(f"dtrain: {nodelist_var}={shown(nodelist)} names a node twice")
    return [Host(n, c) for n, c in zip(nodes, counts)]


# Note [dtrainrun in a SLURM job]
# Where dtrainrun runs in a job decides what it does:
#  * in the batch script (sbatch) or salloc's command: the allocation is in SLURM_JOB_NODELIST
#    and SLURM_TASKS_PER_NODE, there is no SLURM_STEP_ID, and dtrainrun starts the job once, the
#    ranks through srun: MPICH's Hydra with its slurm launcher (`-launcher slurm`: one srun
#    step runs a hydra_pmi_proxy on each node, which starts that node's ranks; SLURM then
#    tracks, signals and cleans up every rank as part of the job), Open MPI's mpirun with its
#    own SLURM support;
#  * as a task of a job step (`srun dtrainrun ...`: SLURM_STEP_ID is set) whose tasks srun gave a
#    process manager interface the program's MPI speaks (`srun --mpi=pmi2` for MPICH,
#    `--mpi=pmix` for Open MPI): srun has started the ranks, one per task, and dtrainrun is each
#    rank's wrapper (labelled lines, signals passed on, the rank's exit status);
#  * as a task of a step without such an interface: refused. Every task would start the whole
#    job (and wait forever for CPUs its own step holds), and the program alone, under srun,
#    would be a one-rank job per task. The layout of the allocation is not in a step's
#    variables either (SLURM_TASKS_PER_NODE is the step's), so even a step of one task does not
#    know it; with -H or --hostfile it runs as given.
# Measured with SLURM 22.05 and MPICH 4.0.2 on Debian 12: MPICH's PMI client works with
# `srun --mpi=pmi2`; srun's pmix plugin needs libpmix2 and Debian's MPICH has no PMIx client.

# What srun's MPI plugins put in a task's environment.
_PMI_OF_PLUGIN = (("pmix", ("PMIX_RANK",)), ("pmi2", ("PMI_FD", "PMI_RANK")))
# The plugin each MPI's client can use under srun.
PMI_FOR_FLAVOR = {"mpich": "pmi2", "openmpi": "pmix"}


@dataclass(frozen=True)
class StepTask:
    """dtrainrun as task `task` of the `tasks` tasks of job step `step`, started by srun."""
    step: str
    task: int
    tasks: int
    pmi: Optional[str]  # 'pmi2', 'pmix', or None: the interface srun gave the tasks


def step_task(env: Mapping[str, str]) -> Optional[StepTask]:
    """The step task this process is, or None (no step: a batch script, salloc, no SLURM).
    Hydra's own srun step, which runs hydra_pmi_proxy, never runs dtrainrun but its
    --rank-shim, which does not ask."""
    step = env.get("SLURM_STEP_ID") or env.get("SLURM_STEPID")
    if not step or not env.get("SLURM_JOB_ID"):
        return None
    tasks = parse_count(env.get("SLURM_STEP_NUM_TASKS") or env.get("SLURM_NTASKS") or "1",
                        MAX_RANKS) or 1
    task = parse_count(env.get("SLURM_PROCID") or "0", MAX_RANKS) or 0
    pmi = next((name for name, variables in _PMI_OF_PLUGIN
                if all(env.get(v) for v in variables)), None)
    return StepTask(step, min(task, MAX_RANKS), min(tasks, MAX_RANKS), pmi)


def step_job_id(env: Mapping[str, str]) -> str:
    """DTRAINRUN_JOB_ID for the ranks of a job step that srun starts as dtrainrun tasks: each task
    is a dtrainrun of its own, so they agree on the step's name instead of a new id each (Note
    [Job identity] in mpi.py)."""
    step = env.get("SLURM_STEP_ID") or env.get("SLURM_STEPID") or "0"
    return re.sub(r"[^A-Za-z0-9._-]", "_", f"slurm-{env.get('SLURM_JOB_ID', '')}.{step}")


def allocation_nodes(env: Mapping[str, str]) -> Optional[List[str]]:
    """The nodes of the allocation this process runs in, or None outside one."""
    var = "SLURM_JOB_NODELIST" if env.get("SLURM_JOB_NODELIST") else "SLURM_NODELIST"
    return expand_nodelist(env[var], var) if env.get(var) else None


def bootstrap(hosts: List[Host], env: Mapping[str, str]) -> Optional[str]:
    """How Hydra should reach the hosts: 'slurm' (srun) inside an allocation that holds them
    all, 'ssh' inside one that does not (srun starts nothing outside its allocation, but Hydra
    picks its slurm launcher in any allocation), None outside an allocation (Hydra's default)."""
    nodes = allocation_nodes(env)
    if nodes is None:
        return None
    return "slurm" if {h.name for h in hosts} <= set(nodes) else "ssh"


def step_refusal(task: StepTask, needed_pmi: Optional[str], program: str) -> str:
    """Why dtrainrun will not run as this step task, and what to run instead."""
    n = task.tasks
    fix = (f"Run dtrainrun once, in the batch script (sbatch -n {n}) or as salloc's command "
           f"(salloc -n {n} dtrainrun {program}): it starts the ranks through srun itself")
    if needed_pmi is not None:
        fix += (f"; or let srun start the ranks with `srun --mpi={needed_pmi} -n {n} "
                f"dtrainrun {program}`")
    if n > 1:
        given = (f"srun gave the tasks {task.pmi}, which the program's MPI cannot use"
                 if task.pmi else "srun gave the tasks no MPI process manager interface "
                 "(no --mpi=pmi2)")
        return (f"dtrain: dtrainrun was started by srun as task {task.task} of {n} "
                f"(SLURM_STEP_ID={task.step}): every task would start the whole job, and "
                f"{given}. {fix}.")
    return (f"dtrain: dtrainrun was started by srun as the only task of job step {task.step}: "
            f"a step's variables hold the step's layout, not the allocation's, so dtrainrun "
            f"cannot tell where the ranks go. {fix}; or give the hosts with -H or --hostfile.")
