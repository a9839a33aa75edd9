"""init_process_group("gradsync") under every launcher a user has: torchrun
(static and c10d rendezvous, and an elastic restart), gsrun, mpirun (Open
MPI, --oversubscribe) and srun's variables (Slurm is not installed here:
the ranks are started with SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID... set as
srun sets them on one node). Each job runs launch_job.py on 2 or 3 ranks:
all_reduce, broadcast and one DDP step, checked; each is bounded by a
timeout and its whole process group is killed after it. Also the mapping of
mpirun's and srun's variables to torch's (gradsync/launch.py) and that its
port agrees with the one gradsync's C library derives.

    PYTHONPATH=build/python /usr/bin/python3 python/tests/test_launch.py [-v] [-k NAME]

gsrun is looked up in GS_TOOLS, else in the build tree that holds the
gradsync package (build/python/gradsync -> build/tools), and the example
gshello in GS_EXAMPLES, else beside it (build/examples); missing programs and
launchers fail the test, they are not skipped.
"""
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest
import uuid

import gradsync
from gradsync import launch

HERE = os.path.dirname(os.path.abspath(__file__))
JOB = os.path.join(HERE, "launch_job.py")
ELASTIC_JOB = os.path.join(HERE, "elastic_job.py")
PYTHON = "/usr/bin/python3"
JOB_TIMEOUT = 180  # seconds for a whole job, torch imports included
OURS = re.compile(r"^(RANK|WORLD_SIZE|LOCAL_RANK|LOCAL_WORLD_SIZE|GROUP_RANK|MASTER_ADDR|MASTER_PORT|"
                  r"TORCHELASTIC_.*|GS_RANK|GS_WORLD_SIZE|GS_LOCAL_RANK|GS_STORE.*|GS_JOB_TOKEN|"
                  r"OMPI_.*|PMIX_.*|SLURM_.*)$")


def tools_dir():
    d = os.environ.get("GS_TOOLS") or os.path.join(
        os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(gradsync.__file__)))), "tools")
    return d


def tool(name, folder=None, variable="GS_TOOLS"):
    folder = folder or tools_dir()
    path = os.path.join(folder, name)
    if not os.access(path, os.X_OK):
        raise AssertionError("%s not found in %s: build it (cmake --build BUILD --target %s) or set %s"
                             % (name, folder, name, variable))
    return path


def example(name):
    folder = os.environ.get("GS_EXAMPLES") or os.path.join(os.path.dirname(tools_dir()), "examples")
    return tool(name, folder, "GS_EXAMPLES")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def clean_env(**extra):
    """This environment without any launcher's variables, plus extra."""
    env = {k: v for k, v in os.environ.items() if not OURS.match(k)}
    env["PYTHONPATH"] = os.path.dirname(os.path.dirname(os.path.abspath(gradsync.__file__)))
    env.update(extra)
    return env


def kill_group(p):
    """SIGTERM to the job's process group, SIGKILL 5 s later if anything is left."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                os.killpg(p.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)


def run_job(argv, env, timeout=JOB_TIMEOUT):
    """Runs a launcher command in its own session; returns (rc, output)."""
    p = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True, stdin=subprocess.DEVNULL)
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(p)
        out, _ = p.communicate()
        raise AssertionError("%s: no end in %d s:\n%s" % (argv[0], timeout, out[-4000:]))
    finally:
        kill_group(p)  # whatever the launcher left behind
    return p.returncode, out


def run_ranks(world, env_of, timeout=JOB_TIMEOUT):
    """Starts `world` ranks ourselves, as srun would, env_of(rank) each."""
    procs = [subprocess.Popen([PYTHON, JOB], env=env_of(r), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, start_new_session=True, stdin=subprocess.DEVNULL)
             for r in range(world)]
    outs, rcs = [], []
    deadline = time.monotonic() + timeout
    try:
        for p in procs:
            try:
                out, _ = p.communicate(timeout=max(1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise AssertionError("rank %d: no end in %d s" % (procs.index(p), timeout))
            outs.append(out)
            rcs.append(p.returncode)
    finally:
        for p in procs:
            kill_group(p)
    return rcs, "".join(outs)


class Launchers(unittest.TestCase):
    def assert_job_ok(self, rc, out, world):
        self.assertEqual(rc, 0, out[-6000:])
        for r in range(world):
            self.assertRegex(out, r"launch-ok rank %d of %d local %d\b" % (r, world, r), out[-6000:])

    def torchrun(self, world, *args, job=JOB, **env):
        exe = shutil.which("torchrun", path="/usr/bin") or "torchrun"
        self.assertTrue(os.access(exe, os.X_OK), "torchrun is missing (Debian's python3-torch has it)")
        # --redirects/--tee: Debian's torchrun 1.13 on Python 3.11 cannot parse their default "0"
        # (Std.from_str iterates an IntFlag, which no longer yields NONE) and fails for any backend
        with tempfile.TemporaryDirectory() as logs:
            return run_job([exe, "--nnodes=1", "--nproc_per_node=%d" % world, "--redirects=1", "--tee=1",
                            "--log_dir=" + logs] + list(args) + [job],
                           clean_env(EXPECT_WORLD=str(world), OMP_NUM_THREADS="1", **env))

    def test_torchrun_static(self):
        for world in (2, 3):
            rc, out = self.torchrun(world, "--master_addr=127.0.0.1", "--master_port=%d" % free_port())
            self.assert_job_ok(rc, out, world)

    def test_torchrun_c10d_rendezvous_and_restart(self):
        # rank 1 fails the first attempt: torchrun restarts every worker, and
        # each makes a new process group (new store, new communicator)
        rc, out = self.torchrun(2, "--rdzv_backend=c10d", "--rdzv_endpoint=127.0.0.1:%d" % free_port(),
                                "--rdzv_id=%s" % uuid.uuid4().hex, "--max_restarts=1", FAIL_ONCE="1")
        self.assert_job_ok(rc, out, 2)
        self.assertEqual(out.count("launch-ok"), 2, out[-6000:])  # only the second attempt got through
        self.assertIn("failed (exitcode: 3) local_rank: 1", out, out[-6000:])
        self.assertEqual(out.count(" attempt 1"), 2, out[-6000:])

    def test_torchrun_elastic_restart_mid_training(self):
        # rank 1 exits inside step 4 of 8 of DDP training: the agent stops rank 0 (left in the
        # all-reduce), starts both again with a new rendezvous round; each makes a new "gradsync"
        # process group and resumes from rank 0's checkpoint; the weights match one process's
        with tempfile.TemporaryDirectory() as ckpt:
            rc, out = self.torchrun(2, "--rdzv_backend=c10d", "--rdzv_endpoint=127.0.0.1:%d" % free_port(),
                                    "--rdzv_id=%s" % uuid.uuid4().hex, "--max_restarts=1",
                                    "--monitor_interval=1", job=ELASTIC_JOB, CKPT_DIR=ckpt, STEPS="8",
                                    FAIL_AT="4")
        self.assertEqual(rc, 0, out[-6000:])
        self.assertIn("elastic-fail rank 1 exits inside step 4", out, out[-6000:])
        self.assertIn("failed (exitcode: 3) local_rank: 1", out, out[-6000:])
        self.assertRegex(out, r"elastic-start rank 0 of 2 attempt 0 from step 0\b", out[-6000:])
        resumed = re.findall(r"elastic-ok rank (\d) of 2 attempt 1 resumed-from (\d+)", out)
        self.assertEqual(sorted(r for r, _ in resumed), ["0", "1"], out[-6000:])
        self.assertEqual(len(set(s for _, s in resumed)), 1, out[-6000:])
        # the checkpoint of step 4 or, when the agent stopped rank 0 while it wrote it, of step 3
        self.assertIn(int(resumed[0][1]), (3, 4), out[-6000:])

    def test_gsrun(self):
        for world in (2, 3):
            rc, out = run_job([tool("gsrun"), "-n", str(world), "--", PYTHON, JOB],
                              clean_env(EXPECT_WORLD=str(world)))
            self.assert_job_ok(rc, out, world)

    def test_mpirun(self):
        mpirun = shutil.which("mpirun")
        self.assertIsNotNone(mpirun, "mpirun is missing (apt-get install openmpi-bin)")
        for world in (2, 3):
            argv = [mpirun, "-np", str(world), "--oversubscribe"]
            if os.geteuid() == 0:
                argv.append("--allow-run-as-root")
            argv += ["-x", "PYTHONPATH", "-x", "EXPECT_WORLD", PYTHON, JOB]
            rc, out = run_job(argv, clean_env(EXPECT_WORLD=str(world)))
            self.assert_job_ok(rc, out, world)

    def test_srun_variables(self):
        # what srun -n W sets on one node (Slurm itself is not installed)
        job = str(10000 + os.getpid() % 50000)
        for world in (2, 3):
            def env_of(rank):
                return clean_env(EXPECT_WORLD=str(world), SLURM_JOB_ID=job, SLURM_STEP_ID=str(world),
                                 SLURM_PROCID=str(rank), SLURM_NTASKS=str(world), SLURM_LOCALID=str(rank),
                                 SLURM_NODEID="0", SLURM_NNODES="1", SLURM_STEP_NUM_NODES="1",
                                 SLURM_NPROCS=str(world), SLURM_STEP_NUM_TASKS=str(world))
            rcs, out = run_ranks(world, env_of)
            self.assert_job_ok(max(rcs), out, world)


class Mapping(unittest.TestCase):
    def test_open_mpi_one_host(self):
        env = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
               "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "OMPI_MCA_ess_base_jobid": "123456"}
        got = launch.torch_env(env)
        self.assertEqual(got, {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
                               "MASTER_ADDR": "127.0.0.1",
                               "MASTER_PORT": str(launch.derived_store_port("123456") - 1)})

    def test_across_hosts_needs_master_addr_and_keeps_the_users(self):
        env = {"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
               "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "PMIX_NAMESPACE": "prterun-x-1@1"}
        self.assertNotIn("MASTER_ADDR", launch.torch_env(env))  # torch then says it expected it
        env.update(MASTER_ADDR="node0", MASTER_PORT="29500")
        got = launch.torch_env(env)
        self.assertEqual(got["RANK"], "3")
        self.assertNotIn("MASTER_ADDR", got)
        self.assertNotIn("MASTER_PORT", got)
        slurm = {"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_NNODES": "4",
                 "SLURM_JOB_ID": "77"}
        got = launch.torch_env(slurm)
        self.assertEqual((got["RANK"], got["WORLD_SIZE"], got["LOCAL_RANK"]), ("5", "8", "1"))
        self.assertNotIn("MASTER_ADDR", got)
        self.assertNotIn("LOCAL_WORLD_SIZE", got)  # not known across nodes

    def test_torchrun_and_gsrun_variables_win(self):
        self.assertEqual(launch.torch_env({"RANK": "0", "WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "1"}), {})
        self.assertEqual(launch.torch_env({"GS_RANK": "0", "SLURM_PROCID": "1"}), {})
        self.assertEqual(launch.torch_env({}), {})

    def test_port_agrees_with_the_c_library(self):
        # two gshello ranks under Open MPI's variables log the store port the
        # C library derives; torch's MASTER_PORT is the one below it
        job = "launch-test-%d" % os.getpid()

        def env_of(rank):
            return clean_env(OMPI_COMM_WORLD_RANK=str(rank), OMPI_COMM_WORLD_SIZE="2",
                             OMPI_COMM_WORLD_LOCAL_RANK=str(rank), OMPI_COMM_WORLD_LOCAL_SIZE="2",
                             OMPI_MCA_ess_base_jobid=job, GS_LOG_LEVEL="info", GS_TIMEOUT_MS="20000")
        procs = [subprocess.Popen([example("gshello")], env=env_of(r), stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True) for r in range(2)]
        outs = [p.communicate(timeout=60)[0] for p in procs]
        self.assertEqual([p.returncode for p in procs], [0, 0], outs)
        m = re.search(r"using 127\.0\.0\.1:(\d+), derived from job id", outs[0])
        self.assertIsNotNone(m, outs[0])
        self.assertEqual(int(m.group(1)), launch.derived_store_port(job))
        self.assertEqual(launch.torch_env(env_of(0))["MASTER_PORT"], str(int(m.group(1)) - 1))


if __name__ == "__main__":
    unittest.main(argv=sys.argv)
