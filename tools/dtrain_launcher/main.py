"""dtrainrun's top level: from the command line to the job's exit status."""
from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from typing import Callable, List, Mapping, Optional, Tuple

from . import cluster, elastic, elastic_run, job, mpi, options, rank, records, slurm
from .errors import EXIT_USAGE, LaunchError, UsageError
from .hosts import (Host, describe, fill, layout_text, rank_hosts, read_hostfile,
                    total_slots)
from .limits import MAX_RANKS, MAX_RANKS_WHY


def say(text: str) -> None:
    """A line on stdout: unbuffered like the job's output, and byte for byte (job.write_text)."""
    job.write_text(1, text + "\n")


def resolve_program(name: str) -> str:
    """The program's path here, so a missing program is refused before anything starts."""
    if os.sep in name:
        if os.path.isfile(name) and os.access(name, os.X_OK):
            return name
        reason = "no such file" if not os.path.exists(name) else "not an executable file"
        raise UsageError(f"dtrain: program '{name}': {reason}")
    found = shutil.which(name)
    if found is None:
        raise UsageError(f"dtrain: program '{name}' is not on PATH; give its path "
                         f"(./{name} if it is in this folder)")
    return found


def plan_hosts(o: options.Options, env: Mapping[str, str]) -> Tuple[List[Host], str]:
    if o.hosts is not None:
        return o.hosts, "-H"
    if o.hostfile is not None:
        return read_hostfile(o.hostfile), f"--hostfile {o.hostfile}"
    allocation = slurm.hosts_from_env(env)
    if allocation is not None:
        return allocation, "the SLURM allocation"
    if o.np is None:
        raise UsageError("dtrain: give the number of ranks with -np N (or hosts with "
                         "-H host:slots,... or --hostfile)")
    return [Host("localhost", o.np)], "this machine"


def plan_layout(np: Optional[int], hosts: List[Host], source: str) -> List[Host]:
    available = total_slots(hosts)
    if np is None and available > MAX_RANKS:
        raise UsageError(f"dtrain: {source} has {available} slots ({describe(hosts)}), more than "
                         f"{MAX_RANKS} ({MAX_RANKS_WHY}); choose how many ranks with -np N")
    wanted = available if np is None else np
    if wanted > available:
        raise UsageError(f"dtrain: -np {wanted} needs {wanted} slots but {source} has "
                         f"{available} ({describe(hosts)}); lower -np or give the hosts more "
                         f"slots")
    return fill(hosts, wanted)


class Context:
    """Where this dtrainrun lives: its own path (ranks run it as their wrapper), its build
    description, and the dtrain-build-info program installed beside it."""

    def __init__(self, entry_script: str, package_root: str):
        self.entry_script = entry_script
        self.job_id = mpi.new_job_id()  # Note [Job identity] in mpi.py
        self.build_config_path = os.path.join(package_root, "build.json")
        self.build_config = mpi.read_build_config(self.build_config_path)
        self.bin_dir = os.path.dirname(entry_script)

    def version(self) -> str:
        if self.build_config and self.build_config.get("dtrain_version"):
            return f"dtrain {self.build_config['dtrain_version']}"
        return "dtrain, from its source tree"

    def build_info_program(self) -> Optional[str]:
        beside = os.path.join(self.bin_dir, "dtrain-build-info")
        if os.access(beside, os.X_OK):
            return beside
        return shutil.which("dtrain-build-info")


def check_build(o: options.Options, ctx: Context) -> int:
    """--check-build: what dtrain was built with (from dtrain-build-info, a program compiled with
    the build), the MPI the program links, and the launcher that would start it. Exits with 0
    when they fit, with EXIT_USAGE when a job would be refused (and says why, as the job would),
    and with 1 when dtrain-build-info is missing or fails."""
    code = 0
    build_config = dict(ctx.build_config or {})
    info = ctx.build_info_program()
    if info is None:
        say("dtrain: dtrain-build-info is not installed beside dtrainrun; build and install "
            "dtrain (cmake --install) to see what it was built with")
        code = 1
    else:
        done = subprocess.run([info], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              stdin=subprocess.DEVNULL, check=False)
        job.write_all(1, done.stdout)
        if done.returncode != 0:
            code = 1
        reported = re.search(rb"^  MPI: (mpich|openmpi) ", done.stdout, re.MULTILINE)
        if reported and build_config.get("mpi_flavor") not in mpi.FLAVORS:
            # No build.json beside this dtrainrun: the compiled program's word stands.
            build_config["mpi_flavor"] = reported.group(1).decode()
    program = resolve_program(o.program[0]) if o.program else None
    if program is not None:
        flavor, evidence = mpi.flavor_of_program(program)
        say(f"  program {o.program[0]}: "
            + (f"links {flavor} ({evidence})" if flavor else f"no MPI found ({evidence})"))
    try:
        launcher = mpi.choose(program, o.mpi, o.launcher, build_config)
    except UsageError as e:
        say(f"  launcher: refused: {e}")
        return EXIT_USAGE
    say(f"  launcher: {launcher.describe()}, because {launcher.reason}")
    built = build_config.get("mpi_flavor")
    if built in mpi.FLAVORS and built != launcher.flavor:
        say(f"  note: dtrain here was built with {built}, the program uses {launcher.flavor}: it "
            f"was built with another dtrain, and gets its own MPI's launcher")
    return code


def _launch(o: options.Options, ctx: Context, launcher: mpi.Launcher, layout: List[Host],
            token: str, restart_count: int, attempt: int,
            extra: Optional[Mapping[str, str]] = None) -> Tuple[List[str], dict]:
    """The launcher's command line and environment for launch number `attempt` of the job;
    `extra`: variables of dtrainrun's own for the ranks (elastic mode's)."""
    env = mpi.launch_environment(os.environ, o.env, restart_count, ctx.job_id, attempt)
    env.update(extra or {})
    argv = mpi.command(launcher, layout,
                       [ctx.entry_script, "--rank-shim", token, "--"] + o.program,
                       env, o.env, o.launcher_agent, os.geteuid() == 0,
                       slurm.bootstrap(layout, os.environ))
    return argv, env


def run_step_task(o: options.Options, ctx: Context, program: str,
                  task: slurm.StepTask) -> int:
    """dtrainrun started by srun as a task of a job step, without -H or --hostfile (Note
    [dtrainrun in a SLURM job] in slurm.py): this task is one rank when srun gave it a process
    manager interface that the program's MPI speaks; otherwise the job is refused."""
    needed, _ = mpi.needed_flavor(program, o.mpi, ctx.build_config)
    wanted = slurm.PMI_FOR_FLAVOR.get(needed) if needed else None
    if task.pmi is None or (wanted is not None and task.pmi != wanted):
        if task.task == 0:  # one message for the job, not one from every task
            sys.stderr.write(slurm.step_refusal(task, wanted or "pmi2", o.program[0]) + "\n")
        return EXIT_USAGE
    if o.np is not None and o.np != task.tasks:
        raise UsageError(f"dtrain: -np {o.np}, but srun started {task.tasks} task(s), each "
                         f"one rank; drop -np, or change srun's -n")
    if o.restarts:
        raise UsageError("dtrain: --restarts: srun started the ranks, and a job it started "
                         "cannot be started again from inside; run dtrainrun in the batch "
                         "script (it starts the ranks through srun) to restart failed jobs")
    env = mpi.launch_environment(os.environ, o.env, 0, slurm.step_job_id(os.environ), 0)
    if o.dry_run:
        say(f"dtrainrun: srun task {task.task} of {task.tasks} (--mpi={task.pmi}) would run "
            f"as rank {task.task}: {shlex.join(o.program)}")
        return 0
    if o.verbose and task.task == 0:
        job.Output(o.prefix, o.verbose).note(
            f"dtrainrun: srun started {task.tasks} task(s) with --mpi={task.pmi}: each runs "
            f"the program as one rank")
    os.environ.clear()
    os.environ.update(env)
    if not o.prefix:
        try:
            os.execvp(program, o.program)
        except OSError as e:
            raise UsageError(f"dtrain: cannot start {o.program[0]}: {e.strerror}") from None
    return rank.run(None, [program] + o.program[1:])


def _attempt_runner(o: options.Options, ctx: Context, launcher: mpi.Launcher,
                    layout: List[Host], output: job.Output, interrupts: job.Interrupts):
    np = total_slots(layout)

    def attempt(number: int) -> job.Attempt:
        token = records.new_token()
        argv, env = _launch(o, ctx, launcher, layout, token, number, number)
        if o.verbose:
            output.note(f"dtrainrun: running {shlex.join(argv)}")
        return job.run_attempt(argv, env, np, token, output, o.start_timeout_s, interrupts,
                               os.path.basename(launcher.path))
    return attempt


def _print_dry_run(o: options.Options, ctx: Context, launcher: mpi.Launcher,
                   layout: List[Host]) -> int:
    say(shlex.join(_launch(o, ctx, launcher, layout, "TOKEN", 0, 0)[0]))
    return 0


def _prepare(o: options.Options, ctx: Context, program: str, layout: List[Host],
             output: job.Output) -> mpi.Launcher:
    launcher = mpi.choose(program, o.mpi, o.launcher, ctx.build_config)
    mpi.launch_environment(os.environ, o.env, 0)  # refuses -x NAME for an unset NAME now
    if o.verbose:
        output.note(f"dtrainrun: MPI: {launcher.describe()}, because {launcher.reason}")
        output.note(f"dtrainrun: {total_slots(layout)} ranks on {layout_text(layout)}")
        if launcher.flavor == "mpich" and not o.launcher_agent:
            how = slurm.bootstrap(layout, os.environ)
            if how == "slurm":
                output.note("dtrainrun: the ranks start through srun (Hydra's slurm launcher), "
                            "as a step of this SLURM job")
            elif how == "ssh":
                output.note("dtrainrun: some hosts are not in this SLURM allocation: the ranks "
                            "start through ssh")
    return launcher


def _elastic_settings(o: options.Options) -> elastic.Settings:
    min_np = o.min_np if o.min_np is not None else o.np
    return elastic.Settings(min_np=min_np, max_np=o.max_np if o.max_np is not None else MAX_RANKS,
                            start_np=o.np if o.np is not None else min_np, restarts=o.restarts,
                            elastic_timeout_s=o.elastic_timeout_s,
                            cooldown_s=o.blacklist_cooldown_s)


def run_elastic(o: options.Options, ctx: Context, program: str, output: job.Output,
                default_slots: int = 1,
                on_layout: Optional[Callable[[List[Host]], None]] = None) -> int:
    """--host-discovery-script: the job as a sequence of worlds (Note [Elastic model] in
    elastic.py)."""
    launcher = mpi.choose(program, o.mpi, o.launcher, ctx.build_config)
    mpi.launch_environment(os.environ, o.env, 0)  # refuses -x NAME for an unset NAME now
    if o.verbose:
        output.note(f"dtrainrun: MPI: {launcher.describe()}, because {launcher.reason}")
    settings = _elastic_settings(o)
    discovery = elastic_run.Discovery(o.host_discovery_script, default_slots, output.note)
    if o.dry_run:
        machine = elastic.Elastic(settings, time.monotonic)
        machine.discovered(discovery.first())
        step = machine.next_world()
        if isinstance(step, elastic.Launch):
            extra = elastic_run.rank_environment(step.generation, "ADDRESS:PORT")
            say(shlex.join(_launch(o, ctx, launcher, step.layout, "TOKEN", 0, step.generation,
                               extra)[0]))
            return 0
        output.note(f"{step.message}; --dry-run does not wait")
        return elastic.EXIT_ELASTIC_TIMEOUT

    with job.Interrupts() as interrupts:
        def run_world(layout: List[Host], extra: Mapping[str, str], restart_count: int,
                      world_output: job.Output) -> job.Attempt:
            token = records.new_token()
            # Every world is one more launch: a restart or a resize (Note [Job identity]).
            generation = int(extra[mpi.ELASTIC_VARIABLES[2]])
            argv, env = _launch(o, ctx, launcher, layout, token, restart_count, generation,
                                extra)
            if o.verbose:
                world_output.note(f"dtrainrun: running {shlex.join(argv)}")
            return job.run_attempt(argv, env, total_slots(layout), token, world_output,
                                   o.start_timeout_s, interrupts,
                                   os.path.basename(launcher.path))

        return elastic_run.run(settings, discovery, run_world, output, interrupts,
                               o.elastic_port, on_layout)


def run_cluster_elastic(o: options.Options, ctx: Context, program: str,
                        hosts: cluster.ClusterHosts) -> int:
    """The leader of an elastic managed-cluster job: the discovery script says which hosts the
    cluster offers now (DTRAIN_HOSTS or SM_HOSTS only choose the leader), and followers are
    welcome whenever they come, since the hosts of a world are the script's to choose."""
    slots, _ = cluster.default_slots(os.environ, o.slots)
    if o.dry_run:
        return run_elastic(o, ctx, program, job.Output(o.prefix, o.verbose), slots)
    leader = cluster.Leader(hosts, o.cluster_port, o.program, [], open_membership=True)
    output = cluster.LeaderOutput(o.prefix, o.verbose, leader)
    code, reason = 1, "the leader failed"
    try:
        code = run_elastic(o, ctx, program, output, slots,
                           lambda layout: leader.set_rank_hosts(rank_hosts(layout)))
        reason = "the job succeeded" if code == 0 else f"the job failed with {code}"
    except (LaunchError, UsageError) as e:
        output.note(str(e))
        code = e.exit_code if isinstance(e, LaunchError) else EXIT_USAGE
        reason = str(e)
    finally:
        leader.finish(code, reason)
    return code


def run_cluster(o: options.Options, ctx: Context, program: str) -> int:
    hosts = cluster.hosts_from_env(os.environ, o.slots)
    if hosts.current != hosts.leader:
        output = job.Output(o.prefix, o.verbose)
        if o.dry_run:
            say(f"dtrainrun: {hosts.current} would follow leader {hosts.leader} on port "
                  f"{o.cluster_port}")
            return 0
        return cluster.follow(hosts, o.cluster_port, o.cluster_timeout_s, o.program, output)
    if o.host_discovery_script is not None:
        return run_cluster_elastic(o, ctx, program, hosts)

    layout = plan_layout(o.np, hosts.hosts, hosts.source)
    plain = job.Output(o.prefix, o.verbose)
    launcher = _prepare(o, ctx, program, layout, plain)
    if o.dry_run:
        return _print_dry_run(o, ctx, launcher, layout)
    leader = cluster.Leader(hosts, o.cluster_port, o.program, rank_hosts(layout))
    output = cluster.LeaderOutput(o.prefix, o.verbose, leader)
    code, reason = 1, "the leader failed"
    try:
        leader.wait_for_followers(o.cluster_timeout_s, output)
        with job.Interrupts() as interrupts:
            code = job.run_with_restarts(_attempt_runner(o, ctx, launcher, layout, output,
                                                         interrupts), o.restarts, output)
        reason = "the job succeeded" if code == 0 else f"the job failed with {code}"
    except LaunchError as e:
        output.note(str(e))
        code, reason = e.exit_code, str(e)
    finally:
        leader.finish(code, reason)
    return code


def run(argv: List[str], entry_script: str, package_root: str) -> int:
    if argv[:1] == ["--rank-shim"]:
        return rank.main(argv[1:])
    ctx = Context(entry_script, package_root)
    try:
        o = options.parse(argv)
        if o.help:
            job.write_text(1, options.help_text())
            return 0
        if o.version:
            say(f"dtrainrun ({ctx.version()})")
            return 0
        if o.check_build:
            return check_build(o, ctx)
        program = resolve_program(o.program[0])
        if o.cluster:
            return run_cluster(o, ctx, program)
        if o.host_discovery_script is not None:
            return run_elastic(o, ctx, program, job.Output(o.prefix, o.verbose))
        task = slurm.step_task(os.environ)
        if task is not None and o.hosts is None and o.hostfile is None:
            return run_step_task(o, ctx, program, task)
        hosts, source = plan_hosts(o, os.environ)
        layout = plan_layout(o.np, hosts, source)
        output = job.Output(o.prefix, o.verbose)
        launcher = _prepare(o, ctx, program, layout, output)
        if o.dry_run:
            return _print_dry_run(o, ctx, launcher, layout)
        with job.Interrupts() as interrupts:
            return job.run_with_restarts(_attempt_runner(o, ctx, launcher, layout, output,
                                                         interrupts), o.restarts, output)
    except UsageError as e:
        sys.stderr.write(f"{e}\n")
        return EXIT_USAGE
    except LaunchError as e:
        sys.stderr.write(f"{e}\n")
        return e.exit_code
    except KeyboardInterrupt:  # before the job started, or while a follower waits
        sys.stderr.write("dtrainrun: interrupted\n")
        return 130
