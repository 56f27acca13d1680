#!/usr/bin/env python3
"""The ResNet trainer with --elastic under dtrainrun's elastic mode, on this machine: the
discovery script offers 2 slots, then 1; world 0 (2 ranks) commits and leaves with 75 at a resize,
and world 1 (1 rank) resumes from exactly that commit, re-shards the rest of the epoch and trains
to the end. Checked: the resize used no restart, world 1 resumed from the step world 0 committed,
and the job ended after the number of steps the re-sharded epochs give. About 20 s.

    resnet_elastic.py DTRAINRUN RESNET_TRAIN [TRAINER FLAGS...]

Trainer flags are added to every world's command line: with --shard gradients, the sharded
optimizer state gathered by 2 ranks is what the 1-rank world resumes.
"""
import os
import re
import subprocess
import sys
import tempfile
import time

# Enough epochs that world 0 is still training when dtrainrun next reads the hosts (every 1 s) and
# asks it to stop at a commit: an epoch takes 0.3 s on an idle 2-core machine.
SAMPLES, BATCH, EPOCHS = 512, 16, 16
WAIT_S = 120


def fail(message, output=""):
    print(f"FAILED: {message}\n{output}")
    sys.exit(1)


def main():
    dtrainrun, trainer = sys.argv[1:3]
    extra = sys.argv[3:]
    with tempfile.TemporaryDirectory(prefix="dtrain-resnet-elastic-") as work:
        hosts = os.path.join(work, "hosts")
        with open(hosts, "w") as f:
            f.write("127.0.0.1:2\n")
        script = os.path.join(work, "discover.sh")
        with open(script, "w") as f:
            f.write(f"#!/bin/sh\ncat {hosts}\n")
        os.chmod(script, 0o755)
        log = os.path.join(work, "out")
        env = {k: v for k, v in os.environ.items() if not k.startswith("DTRAIN_TEST_")}
        with open(log, "w") as out:
            job = subprocess.Popen(
                [dtrainrun, "--min-np", "1", "--max-np", "2", "--host-discovery-script", script,
                 "--", trainer, "--elastic", "--checkpoint-dir", os.path.join(work, "{host}"),
                 "--dataset", "synthetic", "--synthetic-samples", str(SAMPLES), "--image-size",
                 "16", "--model", "resnet8", "--epochs", str(EPOCHS), "--batch-size", str(BATCH),
                 "--checkpoint-every", "2", "--eval-samples", "16", "--threads", "1", "--seed",
                 "3", "--augment", *extra],
                env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
            try:
                deadline = time.monotonic() + WAIT_S
                while "epoch   1/" not in open(log).read():
                    if job.poll() is not None or time.monotonic() > deadline:
                        fail("world 0 did not finish its first epoch", open(log).read())
                    time.sleep(0.1)
                with open(hosts + ".new", "w") as f:
                    f.write("127.0.0.1:1\n")
                os.replace(hosts + ".new", hosts)
                code = job.wait(timeout=WAIT_S)
            except subprocess.TimeoutExpired:
                fail(f"the job did not end within {WAIT_S} s", open(log).read())
            finally:
                if job.poll() is None:
                    job.kill()
                    job.wait()
        text = open(log).read()
    if code != 0:
        fail(f"the job exited with {code}", text)
    left = re.search(r"^\[0\]<stdout>:generation 0: committed step (\d+); leaving", text, re.M)
    resumed = re.search(r"^\[0\]<stdout>:generation 1: resumed from the commit of step (\d+): "
                        r"epoch (\d+), sample (\d+) of", text, re.M)
    final = re.search(r"^\[0\]<stdout>:weights: step (\d+),", text, re.M)
    if not (left and resumed and final):
        fail("expected world 0 to leave at a commit, world 1 to resume from it and a final line",
             text)
    if "after 1 resize(s) and 0 restart(s)" not in text:
        fail("the resize was not a plain resize", text)
    step, epoch, position = (int(g) for g in resumed.groups())
    if step != int(left.group(1)):
        fail(f"world 1 resumed from step {step}, world 0 committed step {left.group(1)}", text)
    # One rank from there on: the rest of the epoch, then whole epochs, in full batches.
    expected = step + (SAMPLES - position) // BATCH + (EPOCHS - epoch) * (SAMPLES // BATCH)
    if int(final.group(1)) != expected:
        fail(f"the job ended at step {final.group(1)}, not {expected}", text)
    if extra and "--shard" in extra and "(--shard)" not in text:
        fail("the trainer did not report its sharded optimizer", text)
    print(f"PASSED: resized from 2 ranks to 1 at step {step} (epoch {epoch}, sample {position}), "
          f"ended at step {expected}{' with ' + ' '.join(extra) if extra else ''}")


if __name__ == "__main__":
    main()
