"""The test harness's Slurm is a real one: a batch job submitted with sbatch runs and completes."""

from __future__ import annotations

from tests.support.slurm import SlurmCluster
from tests.support.waiting import wait_until


def test_sbatch_job_completes(slurm: SlurmCluster, tmp_path) -> None:
    out = tmp_path / "out.txt"
    job = slurm.sbatch("--wrap", 'echo "ran in $SLURM_JOB_ID on $SLURM_JOB_NODELIST"', "-o", str(out))
    wait_until(lambda: slurm.job_state(job) == "COMPLETED", 60, f"Slurm job {job} to complete")
    assert out.read_text() == f"ran in {job} on {slurm.node}\n"
    assert slurm.jobs()[job]["exit_code"] == 0
