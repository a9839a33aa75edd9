"""torch.distributed's env:// variables from the launcher that started us.

torchrun and gsrun set RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
MASTER_ADDR and MASTER_PORT themselves. mpirun (Open MPI) and srun (Slurm)
set their own variables, so `import gradsync` fills torch's in from them
before init_process_group reads them, with nothing set already overridden:

    variable          Open MPI                      Slurm
    RANK              OMPI_COMM_WORLD_RANK          SLURM_PROCID
    WORLD_SIZE        OMPI_COMM_WORLD_SIZE          SLURM_NTASKS
    LOCAL_RANK        OMPI_COMM_WORLD_LOCAL_RANK    SLURM_LOCALID
    LOCAL_WORLD_SIZE  OMPI_COMM_WORLD_LOCAL_SIZE    SLURM_NTASKS on one node
    MASTER_ADDR       127.0.0.1 on one host; across hosts the user sets it
    MASTER_PORT       derived from the job id (the same on every rank)

The port is one below the store port gradsync's C library derives for the
same job (src/bootstrap/discover.c), so a program that also makes a
gradsync context of its own finds that store at MASTER_PORT + 1, as under
torchrun, and the two never collide.
"""
import os

# src/bootstrap/discover.c: DERIVED_PORT_BASE, DERIVED_PORT_SPAN
_PORT_BASE = 20000
_PORT_SPAN = 12000


def _fnv1a(text):
    h = 0xcbf29ce484222325
    for byte in text.encode():
        h = ((h ^ byte) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h


def derived_store_port(job_id):
    """The port gradsync's C library derives for its own store from job_id."""
    return _PORT_BASE + _fnv1a(job_id) % _PORT_SPAN


def _open_mpi(env):
    local_size = env.get("OMPI_COMM_WORLD_LOCAL_SIZE")
    return {
        "RANK": env["OMPI_COMM_WORLD_RANK"],
        "WORLD_SIZE": env.get("OMPI_COMM_WORLD_SIZE"),
        "LOCAL_RANK": env.get("OMPI_COMM_WORLD_LOCAL_RANK"),
        "LOCAL_WORLD_SIZE": local_size,
    }, env.get("OMPI_MCA_ess_base_jobid") or env.get("PMIX_NAMESPACE"), \
        local_size is not None and local_size == env.get("OMPI_COMM_WORLD_SIZE")


def _slurm(env):
    nodes = env.get("SLURM_STEP_NUM_NODES") or env.get("SLURM_NNODES")
    one_node = nodes == "1"
    job = env.get("SLURM_JOB_ID")
    return {
        "RANK": env["SLURM_PROCID"],
        "WORLD_SIZE": env.get("SLURM_NTASKS"),
        "LOCAL_RANK": env.get("SLURM_LOCALID"),
        "LOCAL_WORLD_SIZE": env.get("SLURM_NTASKS") if one_node else None,
    }, job and "%s.%s" % (job, env.get("SLURM_STEP_ID", "0")), one_node


def torch_env(env):
    """The variables to add to env (a mapping) for torch's env://: {} when
    RANK is set already (torchrun, gsrun) or no known launcher is found."""
    if "RANK" in env or "WORLD_SIZE" in env or "GS_RANK" in env:
        return {}
    if "OMPI_COMM_WORLD_RANK" in env:
        found, job, one_host = _open_mpi(env)
    elif "SLURM_PROCID" in env:
        found, job, one_host = _slurm(env)
    else:
        return {}
    if one_host:
        found["MASTER_ADDR"] = "127.0.0.1"
    if job:
        found["MASTER_PORT"] = str(derived_store_port(job) - 1)
    return {k: v for k, v in found.items() if v is not None and k not in env}


def export_torch_env(env=os.environ):
    """Sets torch.distributed's env:// variables from mpirun's or srun's."""
    env.update(torch_env(env))
