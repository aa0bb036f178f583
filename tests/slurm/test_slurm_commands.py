"""exec/slurm.py's reading of Slurm's answers, on squeue's own words (Slurm 22.05)."""

from __future__ import annotations

import json

import pytest

from xce_lite.exec import slurm

# what `squeue --json --me` prints, exit status 0, when slurmctld is gone (observed)
GONE = {"meta": {}, "errors": [{"description": "Failed while looking for jobs", "error_number": -1,
                                "error": "Unspecified error", "source": "slurm_load_jobs"}], "jobs": []}


def test_squeue_saying_it_failed_is_an_error_not_an_empty_queue():
    with pytest.raises(slurm.SlurmError, match="slurm_load_jobs: Failed while looking for jobs"):
        slurm.parse_squeue(json.dumps(GONE))
    with pytest.raises(slurm.SlurmError, match="no JSON"):
        slurm.parse_squeue("slurm_load_jobs error: Unable to contact slurm controller")
    assert slurm.parse_squeue(json.dumps({"jobs": []})) == {}


@pytest.mark.parametrize("words, unsure", [
    ("sbatch did not answer within 30 s; is slurmctld up (`scontrol ping`)?", True),
    ("sbatch failed: sbatch: error: Batch job submission failed: Socket timed out on send/recv operation", True),
    ("sbatch failed: sbatch: error: Batch job submission failed: Unable to contact slurm controller "
     "(connect failure)", False),
    ("sbatch failed: sbatch: error: Batch job submission failed: Invalid partition name specified", False),
])
def test_an_sbatch_that_timed_out_may_have_reached_slurm(words, unsure):
    assert slurm.unsure(words) is unsure
